#include "parallel/pipeline_head.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline_messages.h"

namespace kvserve {
namespace {

class PipelineHead : public ModelRunner {
 public:
  PipelineHead(const Model& first_stage, const KVPoolShape& pool, const PipelineOptions& options)
      : options_(options),
        comm_(*options.comm),
        vocab_(first_stage.config().vocab_size),
        dim_(first_stage.config().dim),
        storage_(first_stage.config().n_layers, pool.n_blocks, pool.block_size, first_stage.config().n_kv_heads,
                 first_stage.config().head_dim, pool.type, first_stage.config().is_mla()),
        transformer_(first_stage, AttentionKernel::kFlash) {
    if (comm_.rank() != 0 || comm_.size() < 2)
      throw Error("the pipeline's engine runs on rank 0 of at least 2 ranks, not rank " + std::to_string(comm_.rank()) +
                  " of " + std::to_string(comm_.size()));
    if (!first_stage.embeds_tokens() || first_stage.has_output_head())
      throw Error("rank 0 of a pipeline holds the first layers of the model, not all of them");
    std::vector<std::byte> setup = pipeline_setup(first_stage, comm_.size(), pool).encode();
    comm_.broadcast(0, setup, options_.timeout);
    // Every other rank answers: ready (an empty logits reply) or why not.
    for (int answered = 1; answered < comm_.size(); ++answered) {
      const int sender = comm_.recv(Communicator::kAnyRank, kPipelineReplyTag, reply_, options_.timeout);
      decode_reply(reply_, sender, {});
    }
  }

  ~PipelineHead() override {
    if (!broken_.empty()) return;
    try {
      comm_.send(1, kPipelineStepTag, encode_shutdown(), options_.timeout);
    } catch (const Error&) {  // the other ranks are gone already; nothing is left to stop
    }
  }

  // The pipeline keeps every layer in the full group (the engine turns the sliding group off).
  int64_t block_bytes(KVGroup group) const override { return group == KVGroup::kFull ? storage_.block_bytes(group) : 0; }
  void copy_block(BlockId src, BlockId dst, KVGroup group) override {
    check(group == KVGroup::kFull, "a pipeline has no sliding-window group");
    storage_.copy_block(src, dst);
    pending_copies_.push_back({src, dst});  // the later stages copy theirs before the next step
  }

  void forward_batch(std::span<const SequenceChunk> chunks, float* logits) override {
    if (!broken_.empty()) throw Error(broken_);
    int64_t n = 0, rows = 0;
    for (const SequenceChunk& c : chunks) {
      n += static_cast<int64_t>(c.tokens.size());
      rows += c.want_logits ? c.logits_rows : 0;
    }
    activations_.resize(static_cast<size_t>(n * dim_));
    transformer_.forward_stage(chunks, storage_, nullptr, activations_.data(), nullptr);
    encode_step(pending_copies_, chunks, std::span<const float>(activations_.data(), activations_.size()), message_);
    pending_copies_.clear();
    int sender = 0;
    try {
      comm_.send(1, kPipelineStepTag, message_, options_.timeout);
      sender = comm_.recv(Communicator::kAnyRank, kPipelineReplyTag, reply_, options_.timeout);
    } catch (const Error& e) {
      broken_ = std::string(e.what()) + " (the pipeline is stopped)";
      if (options_.on_failure) options_.on_failure(broken_);
      throw Error(broken_);
    }
    // A rank's own error (its layers failed) throws here; the pipeline stays in step.
    decode_reply(reply_, sender, std::span<float>(logits, static_cast<size_t>(rows * vocab_)));
  }

 private:
  PipelineOptions options_;
  Communicator& comm_;
  int64_t vocab_, dim_;
  PagedKVStorage storage_;  // K/V of the first stage's layers
  Transformer transformer_;
  std::vector<BlockCopy> pending_copies_;  // copy-on-write since the last step, for the other stages
  std::vector<float> activations_;  // [n][dim] residual stream after the first stage
  std::vector<std::byte> message_, reply_;
  std::string broken_;  // why the pipeline stopped; empty while it works
};

}  // namespace

std::unique_ptr<ModelRunner> make_pipeline_head(const Model& first_stage, const KVPoolShape& pool,
                                                const PipelineOptions& options) {
  check(options.comm != nullptr, "a pipeline head has a communicator");
  return std::make_unique<PipelineHead>(first_stage, pool, options);
}

}  // namespace kvserve
