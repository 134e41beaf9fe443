#pragma once
// What a drafter proposes for speculative decoding, and the interface every
// drafter implements: ModelDrafter (model_drafter.h) and NgramDrafter
// (ngram_drafter.h). See docs/speculative.md.
#include <cstdint>
#include <span>
#include <vector>

#include "sampling/sampler.h"

namespace kvserve {

// One round's proposal.
struct DraftProposal {
  std::vector<int32_t> tokens;
  // [tokens.size()][vocab]: the distribution each token was drawn from. Empty
  // for a deterministic drafter, whose q is one-hot on its token.
  std::vector<float> probs;
  bool deterministic() const { return probs.empty(); }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Proposes at most k tokens (possibly none) to follow `history` (prompt and
  // generated tokens so far). May draw random numbers from `sampler`.
  virtual void propose(std::span<const int32_t> history, int64_t k, Sampler& sampler, DraftProposal& out) = 0;
  // The sequence is now `history` (after a verification or a restart): drop
  // any state past the common prefix and catch up on all but the last token.
  virtual void commit(std::span<const int32_t> history) = 0;
  virtual const char* name() const = 0;
};

}  // namespace kvserve
