// A tied embedding whose head was repacked is read from the file's mapping
// only for token lookups, and those pages are dropped again: a prompt of
// thousands of distinct tokens leaves at most a window or two of the table
// mapped (counted in /proc/self/pagemap), not the rows it touched.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <unistd.h>
#include <vector>

#include "decode/decoder.h"
#include "model/model.h"
#include "test_util.h"

namespace {

// Pages of [p, p + n) mapped in this process; -1 where pagemap cannot be read.
int64_t mapped_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  FILE* f = std::fopen("/proc/self/pagemap", "rb");
  if (f == nullptr) return -1;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page, last = (reinterpret_cast<uintptr_t>(p) + n - 1) / page;
  std::vector<uint64_t> entries(last - first + 1);
  const bool ok = std::fseek(f, static_cast<long>(first * sizeof(uint64_t)), SEEK_SET) == 0 &&
                  std::fread(entries.data(), sizeof(uint64_t), entries.size(), f) == entries.size();
  std::fclose(f);
  if (!ok) return -1;
  int64_t present = 0;
  for (const uint64_t e : entries) present += static_cast<int64_t>(e >> 63);
  return present;
}

}  // namespace

TEST(EmbeddingPages, DistinctPromptTokensLeaveTheTiedTableUnmapped) {
  const std::string path = kvserve::test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "models/smollm2-135m-instruct-q4_1.gguf not found";
  auto model = kvserve::Model::load(path);
  const kvserve::TensorView& table = model->weights().token_embd;
  if (!model->weights().tied_output || model->weights().output.packed == nullptr)
    GTEST_SKIP() << "the head is not a repacked copy of the embedding on this CPU (no packed kernels)";
  if (mapped_pages(table.data, table.nbytes) < 0) GTEST_SKIP() << "/proc/self/pagemap not readable";

  // 600 distinct ids spread over the whole table (a few prefill chunks).
  std::vector<int32_t> prompt(600);
  const int64_t vocab = model->config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919) % vocab);
  auto decoder = kvserve::make_decoder("cached", *model, 1024, kvserve::KVType::F16);
  decoder->append_all(prompt);
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t table_pages = static_cast<int64_t>(table.nbytes) / page;
  const int64_t resident = mapped_pages(table.data, table.nbytes);
  // At most the 2 MB windows around the last row (a row can straddle two).
  EXPECT_LE(resident, 2 * (2 << 20) / page) << resident << " of " << table_pages << " pages mapped";
}
