#include "parallel/model_runner.h"

#include <utility>

namespace kvserve {
namespace {

class LocalRunner : public ModelRunner {
 public:
  LocalRunner(const Model& model, PagedKVStorage storage)
      : storage_(std::move(storage)), transformer_(model, AttentionKernel::kFlash) {}
  void copy_block(BlockId src, BlockId dst, KVGroup group) override { storage_.copy_block(src, dst, group); }
  int64_t block_bytes(KVGroup group) const override { return storage_.block_bytes(group); }
  void forward_batch(std::span<const SequenceChunk> chunks, float* logits) override {
    transformer_.forward_batch(chunks, storage_, logits);
  }

 private:
  PagedKVStorage storage_;
  Transformer transformer_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_local_runner(const Model& model, PagedKVStorage storage) {
  return std::make_unique<LocalRunner>(model, std::move(storage));
}

std::unique_ptr<ModelRunner> make_local_runner(const Model& model, const KVPoolShape& pool) {
  const ModelConfig& c = model.config();
  return make_local_runner(model, PagedKVStorage(c.n_layers, pool.n_blocks, pool.block_size, c.n_kv_heads, c.head_dim, pool.type,
                                                            c.is_mla()));
}

}  // namespace kvserve
