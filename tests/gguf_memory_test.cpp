// The GGUF reader's memory is bounded by the file's bytes (model/gguf.h):
// arrays of strings are stored compactly (10^7 empty strings load in about
// the file's own bytes), and files whose metadata would take more than
// kGGUFMemoryPerFileByte x their bytes (+ 1 MiB) are refused with an error
// naming the file before the allocation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

namespace {

// GGUF v3 bytes written field by field, as a hostile file would be.
class RawGguf {
 public:
  RawGguf(uint64_t n_tensors, uint64_t n_kv) { u32(0x46554747).u32(3).u64(n_tensors).u64(n_kv); }
  RawGguf& u8(uint8_t v) { return put(v); }
  RawGguf& u32(uint32_t v) { return put(v); }
  RawGguf& u64(uint64_t v) { return put(v); }
  RawGguf& str(const std::string& s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  // Writes the bytes, then `zeros` zero bytes (the body of a huge array).
  void write(const std::string& path, size_t zeros = 0) const {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes_.data(), static_cast<std::streamsize>(bytes_.size()));
    const std::vector<char> block(1 << 20, 0);
    for (size_t left = zeros; left > 0; left -= std::min(left, block.size()))
      out.write(block.data(), static_cast<std::streamsize>(std::min(left, block.size())));
  }

 private:
  template <typename T>
  RawGguf& put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  std::vector<char> bytes_;
};

constexpr uint32_t kU8 = 0, kString = 8, kArray = 9;

// This process's anonymous resident bytes (the heap, not the file mapping).
size_t rss_anon_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  return 0;
}

std::string load_error(const std::string& path) {
  try {
    GGUFFile file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST(GGUFMemory, TenMillionEmptyStringsLoadInAboutTheFilesBytes) {
  constexpr uint64_t kCount = 10'000'000;
  TempFile file(".gguf");
  RawGguf(0, 1).str("big.strings").u32(kArray).u32(kString).u64(kCount).write(file.path(), kCount * 8);
  const size_t rss_before = rss_anon_bytes();
  const GGUFFile gguf(file.path());
  const size_t rss_after = rss_anon_bytes();
  const size_t rss_grown = rss_after > rss_before ? rss_after - rss_before : 0;
  const GGUFStrings& strings = gguf.get_string_array("big.strings");
  ASSERT_EQ(strings.size(), kCount);
  EXPECT_EQ(strings[0], "");
  EXPECT_EQ(strings[kCount - 1], "");
  std::printf("10^7 empty strings: file %zu bytes, reader's count %zu bytes, RssAnon +%zu bytes\n", gguf.file_size(),
              gguf.parsed_memory(), rss_grown);
  // One 8-byte offset per 8-byte length prefix: the reader's count and the heap both stay near 1x.
  EXPECT_LE(gguf.parsed_memory(), gguf.file_size() + kGGUFMemorySlack);
  EXPECT_LE(rss_grown, kGGUFMemoryPerFileByte * gguf.file_size()) << rss_grown << " bytes";
}

TEST(GGUFMemory, StringArraysKeepTheirContents) {
  TempFile file(".gguf");
  GGUFWriter w;
  w.set_string_array("some.strings", {"", "a", std::string(40, 'x'), "日本", ""});
  w.write(file.path());
  const GGUFFile gguf(file.path());
  const GGUFStrings& s = gguf.get_string_array("some.strings");
  EXPECT_EQ(s.to_vector(), (std::vector<std::string>{"", "a", std::string(40, 'x'), "日本", ""}));
  EXPECT_EQ(s, (GGUFStrings{"", "a", std::string(40, 'x'), "日本", ""}));
  EXPECT_EQ(s[2].size(), 40u);
}

TEST(GGUFMemory, AByteArrayPastTheBoundIsAnErrorNamingTheFile) {
  // 2^20 one-byte numbers become 8 MiB of doubles: more than 4x a 1 MiB file + 1 MiB.
  constexpr uint64_t kCount = uint64_t{1} << 20;
  TempFile file(".gguf");
  RawGguf(0, 1).str("big.bytes").u32(kArray).u32(kU8).u64(kCount).write(file.path(), kCount);
  const std::string error = load_error(file.path());
  EXPECT_NE(error.find(file.path()), std::string::npos) << error;
  EXPECT_NE(error.find("big.bytes"), std::string::npos) << error;
  EXPECT_NE(error.find("bytes of memory (4x the file's bytes + 1 MiB)"), std::string::npos) << error;
}

TEST(GGUFMemory, ManySmallKeysPastTheBoundAreAnError) {
  // 200,000 distinct keys of 19 file bytes each: a map node and a value each, over 10x the file.
  TempFile file(".gguf");
  RawGguf raw(0, 200'000);
  for (int k = 0; k < 200'000; ++k) {
    char key[8];
    std::snprintf(key, sizeof key, "k%06d", k);
    raw.str(std::string(key, 6)).u32(kU8).u8(1);
  }
  raw.write(file.path());
  const std::string error = load_error(file.path());
  EXPECT_NE(error.find("bytes of memory"), std::string::npos) << error;
}

TEST(GGUFMemory, ManyTensorInfosPastTheBoundAreAnError) {
  // 100,000 tensor infos of 32 bytes (empty name, one dim): each costs a TensorView and an index entry.
  constexpr uint64_t kTensors = 100'000;
  TempFile file(".gguf");
  RawGguf raw(kTensors, 0);
  for (uint64_t k = 0; k < kTensors; ++k) raw.str("").u32(1).u64(1).u32(0).u64(0);
  raw.write(file.path(), 64);
  const std::string error = load_error(file.path());
  EXPECT_NE(error.find("tensor_count"), std::string::npos) << error;
  EXPECT_NE(error.find("bytes of memory"), std::string::npos) << error;
}

TEST(GGUFMemory, ARealSizedVocabularyIsFarBelowTheBound) {
  TempFile file(".gguf");
  test_util::write_synth_model(file.path());
  const GGUFFile gguf(file.path());
  EXPECT_GT(gguf.parsed_memory(), 0u);
  EXPECT_LE(gguf.parsed_memory(), gguf.file_size() + kGGUFMemorySlack);
}
