#pragma once
// The exact accept / reject rule that keeps speculative output distributed as
// the target's (speculative_session.h explains it), shared by
// SpeculativeSession and the batching engine (request_speculation.h), and the
// adaptive draft length.
#include <cstdint>
#include <span>
#include <vector>

#include "sampling/sampler.h"
#include "speculation/drafter.h"

namespace kvserve {

// A token from `probs` (which sums to 1): the argmax when the sampler is
// greedy (no random number used), else an inverse-CDF draw.
int32_t draw_token(std::span<const float> probs, Sampler& sampler);

// Reusable buffers of verify_draft (vocab-sized rows; no state between calls).
struct VerifyScratch {
  std::vector<int32_t> context;  // history + the drafts accepted so far, for penalties
  std::vector<float> logits;     // [vocab] Sampler::distribution consumes its input
  std::vector<float> probs;      // [vocab] the target's processed distribution
  std::vector<float> residual;   // [vocab] normalize(max(0, p - q)) after a rejection
};

// One round's accept / reject walk over the target's rows [drafts + 1][vocab]
// (row i: the logits after `history` and the first i drafts). Replaces
// `produced` with the 1..drafts+1 tokens the round yields and returns how many
// drafts were accepted. Draws from `sampler` unless it is greedy. Shared by
// SpeculativeSession and the batching engine (request_speculation.h).
int64_t verify_draft(std::span<const float> target_rows, const DraftProposal& proposal,
                     std::span<const int32_t> history, Sampler& sampler, VerifyScratch& scratch,
                     std::vector<int32_t>& produced);

// Adaptive k: one more draft after a fully accepted round (up to max_k), one
// fewer when under half of the drafts survive (down to 1).
int64_t adapt_draft_k(int64_t k, int64_t proposed, int64_t accepted, int64_t max_k);

}  // namespace kvserve
