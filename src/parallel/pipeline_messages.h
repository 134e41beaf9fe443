#pragma once
// The bytes the ranks of a pipeline exchange (docs/scaling.md counts them):
//   setup (rank 0 broadcasts it once): the model's shape and the KV pool's,
//     so that every rank checks it loaded the same file and mirrors the pool.
//   step (rank r to rank r + 1, every step): the plan (block copies made since
//     the previous step, then per chunk its token count, first position,
//     logits rows and page table) and the residual stream [n][dim] f32 after
//     rank r's layers. Token ids are not sent: only rank 0 embeds them.
//   reply (a rank to rank 0): the last stage's logits rows, or a rank's error.
// Encoded as little-endian machine words (every rank runs the same build).
// A received message is untrusted bytes: decoding checks every count against
// the bytes that hold it (overflow-checked) and every block id, position and
// token count against the receiving stage's pool, and throws kvserve::Error
// naming what is wrong; nothing a message says is used unchecked.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/transformer.h"
#include "parallel/model_runner.h"

namespace kvserve {

inline constexpr int kPipelineStepTag = 1;   // rank r -> r + 1
inline constexpr int kPipelineReplyTag = 2;  // any rank -> rank 0

struct PipelineSetup {
  int64_t ranks = 0;
  int64_t total_layers = 0;  // the file's blocks
  int64_t dim = 0;
  int64_t vocab = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_blocks = 0;    // the KV pool every rank mirrors, for its own layers
  int64_t block_size = 0;
  int64_t kv_type = 0;     // a KVType
  int64_t activations = 0; // the ActivationPrecision rank 0's matmuls use

  std::vector<std::byte> encode() const;
  // Throws kvserve::Error for a message of the wrong size or a field below 1
  // (kv_type and activations below 0).
  static PipelineSetup decode(std::span<const std::byte> bytes);
  bool operator==(const PipelineSetup&) const = default;
};

// The setup of a pipeline of `ranks` over `stage`'s model with this pool:
// what rank 0 sends and what every other rank expects of its own stage.
PipelineSetup pipeline_setup(const Model& stage, int ranks, const KVPoolShape& pool);
// The fields in which two setups differ, e.g. "vocab 49152 vs 320"; "" when equal.
std::string setup_differences(const PipelineSetup& a, const PipelineSetup& b);

// One chunk of a step as the later stages see it.
struct ChunkPlan {
  int64_t n_tokens = 0;
  int64_t pos0 = 0;
  int64_t logits_rows = 0;  // 0: no logits wanted
  std::vector<BlockId> block_table;
};

struct StepMessage {
  bool shutdown = false;          // the pipeline ends: no plan, no activations
  std::vector<BlockCopy> copies;  // applied in order before the step's layers
  std::vector<ChunkPlan> chunks;
  std::vector<float> activations; // [sum of n_tokens][dim]

  int64_t n_tokens() const;
  // The chunks as forward_stage takes them; their token spans point into
  // `tokens` (resized to n_tokens(), contents unused after the first stage).
  std::vector<SequenceChunk> sequence_chunks(std::vector<int32_t>& tokens) const;
};

// What a step message may name, from the receiving stage's setup.
struct StepLimits {
  int64_t dim = 0;         // floats per token of activations
  int64_t n_blocks = 0;    // block ids lie in [0, n_blocks)
  int64_t block_size = 0;  // a chunk's table covers pos0 + n_tokens positions
};

// A step message: copies, chunks and the activations [n][dim] after the sender's layers.
void encode_step(std::span<const BlockCopy> copies, std::span<const SequenceChunk> chunks,
                 std::span<const float> activations, std::vector<std::byte>& out);
std::vector<std::byte> encode_shutdown();
// Throws kvserve::Error for a malformed message: sizes that do not add up, a
// block id outside the pool, a chunk whose positions its page table does not
// cover, more tokens than the pool has slots.
StepMessage decode_step(std::span<const std::byte> bytes, const StepLimits& limits);

// Replies: logits rows [rows][vocab] (ok), or an error text.
void encode_logits_reply(std::span<const float> logits, std::vector<std::byte>& out);
std::vector<std::byte> encode_error_reply(const std::string& message);
// The logits into `logits` (expected_floats of them); throws kvserve::Error
// with the sender's message for an error reply, or for a size mismatch.
void decode_reply(std::span<const std::byte> bytes, int sender, std::span<float> logits);

}  // namespace kvserve
