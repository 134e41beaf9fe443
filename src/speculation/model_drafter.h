#pragma once
// A draft model as the single-sequence drafter (the batching engine drafts
// with DraftModelBatch instead), and the vocabulary check every draft model
// passes before it drafts for a target.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "decode/decoder.h"
#include "model/model.h"
#include "speculation/drafter.h"

namespace kvserve {

// Drafts autoregressively with a smaller model sharing the target's
// vocabulary (check_same_vocabulary), with its own cached decoder.
class ModelDrafter : public Drafter {
 public:
  ModelDrafter(const Model& draft, int64_t max_context);
  void propose(std::span<const int32_t> history, int64_t k, Sampler& sampler, DraftProposal& out) override;
  void commit(std::span<const int32_t> history) override;
  const char* name() const override { return "draft-model"; }
  const Decoder& decoder() const { return *decoder_; }

 private:
  // Makes the decoder hold history[0, n) (n <= history.size()); returns the
  // logits after it when it had to append anything, else an empty span.
  std::span<const float> sync(std::span<const int32_t> history, size_t n);

  std::unique_ptr<Decoder> decoder_;
  std::vector<int32_t> cached_;   // the tokens the decoder holds
  std::vector<float> logits_;     // scratch: Sampler::distribution consumes its input
  std::vector<int32_t> context_;  // history + drafts so far, for penalties
};

// Throws kvserve::Error unless both models have the same vocabulary size and
// the same token strings, naming both sizes or the first differing token.
void check_same_vocabulary(const Model& target, const Model& draft);

}  // namespace kvserve
