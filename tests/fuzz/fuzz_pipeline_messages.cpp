// libFuzzer target: arbitrary bytes as a message from another pipeline rank
// (parallel/pipeline_messages.h), through every decoder. Only kvserve::Error
// may come out, and a decoded step must keep every promise decode_step makes
// (block ids in the pool, positions covered by the page table, activations of
// n_tokens x dim); anything else aborts.
#include <cstdlib>
#include <span>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline_messages.h"
#include "tests/fuzz/pipeline_seed_limits.h"

using namespace kvserve;

namespace {

void check_step(const StepMessage& m, const StepLimits& limits) {
  const auto in_pool = [&](BlockId id) { return id >= 0 && id < limits.n_blocks; };
  for (const BlockCopy& c : m.copies)
    if (!in_pool(c.src) || !in_pool(c.dst)) std::abort();
  for (const ChunkPlan& c : m.chunks) {
    for (const BlockId id : c.block_table)
      if (!in_pool(id)) std::abort();
    if (c.n_tokens < 1 || c.pos0 < 0 || c.logits_rows < 0 || c.logits_rows > c.n_tokens ||
        c.pos0 + c.n_tokens > static_cast<int64_t>(c.block_table.size()) * limits.block_size)
      std::abort();
  }
  if (static_cast<int64_t>(m.activations.size()) != m.n_tokens() * limits.dim) std::abort();
  std::vector<int32_t> tokens;
  const std::vector<SequenceChunk> chunks = m.sequence_chunks(tokens);
  if (chunks.size() != m.chunks.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const StepMessage m = decode_step(bytes, pipeline_fuzz::kSeedLimits);
    if (!m.shutdown) check_step(m, pipeline_fuzz::kSeedLimits);
  } catch (const Error&) {
  }
  try {
    PipelineSetup::decode(bytes);
  } catch (const Error&) {
  }
  try {
    float logits[pipeline_fuzz::kSeedLogits];
    decode_reply(bytes, 1, logits);
  } catch (const Error&) {
  }
  return 0;
}
