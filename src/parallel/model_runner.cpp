#include "parallel/model_runner.h"

namespace kvserve {
namespace {

class LocalRunner : public ModelRunner {
 public:
  LocalRunner(const Model& model, const KVPoolShape& pool)
      : storage_(model.config().n_layers, pool.n_blocks, pool.block_size, model.config().n_kv_heads,
                 model.config().head_dim, pool.type),
        transformer_(model, AttentionKernel::kFlash) {}
  void copy_block(BlockId src, BlockId dst) override { storage_.copy_block(src, dst); }
  void forward_batch(std::span<const SequenceChunk> chunks, float* logits) override {
    transformer_.forward_batch(chunks, storage_, logits);
  }

 private:
  PagedKVStorage storage_;
  Transformer transformer_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_local_runner(const Model& model, const KVPoolShape& pool) {
  return std::make_unique<LocalRunner>(model, pool);
}

}  // namespace kvserve
