#pragma once
// The engine's batched step over the whole model, wherever its layers run:
// in this process (make_local_runner) or along a pipeline of ranks
// (PipelineHead, pipeline_head.h). A runner owns the K/V bytes of the layers
// it runs; the engine's KVCacheManager decides the block ids for all of them.
// Not thread-safe: owned by the engine thread.
#include <memory>
#include <span>

#include "kv/kv_planner.h"
#include "kv/paged_kv_storage.h"
#include "model/transformer.h"

namespace kvserve {

// The paged KV pool every stage mirrors.
struct KVPoolShape {
  int64_t n_blocks = 0;
  int64_t block_size = 0;
  KVType type = KVType::F32;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Copies block src's K/V rows into block dst in every layer of the group (copy-on-write).
  virtual void copy_block(BlockId src, BlockId dst, KVGroup group = KVGroup::kFull) = 0;
  // Bytes of one block of the group in this process's layers.
  virtual int64_t block_bytes(KVGroup group) const = 0;
  // Transformer::forward_batch over every layer of the model.
  virtual void forward_batch(std::span<const SequenceChunk> chunks, float* logits) = 0;
};

// The whole model in this process: one Transformer over `storage` (which
// may have a sliding-window group, kv_cache_manager.h).
std::unique_ptr<ModelRunner> make_local_runner(const Model& model, PagedKVStorage storage);
// Same over a plain pool of that shape (every layer in one group).
std::unique_ptr<ModelRunner> make_local_runner(const Model& model, const KVPoolShape& pool);

}  // namespace kvserve
