#pragma once
// Speculative decoding for one sequence: a cheap drafter proposes k tokens,
// the target scores all of them in one forward pass (Decoder::append_all),
// and the standard rejection rule keeps the output distribution exactly the
// target's (Leviathan et al. 2023, Chen et al. 2023):
//   accept draft token x with probability min(1, p(x) / q(x)), left to right;
//   on the first rejection emit a sample of normalize(max(0, p - q)) instead;
//   if every draft is accepted, emit a bonus sample of the target's next p.
// p and q are the *processed* distributions (Sampler::distribution, same
// sampling params for both), so temperature / top-k / top-p / penalties are
// honoured. Greedy (temperature 0) makes p and q one-hot: it accepts while the
// argmaxes agree and emits exactly the target's greedy tokens. A deterministic
// drafter (prompt lookup) has a one-hot q: accept with probability p(x), and on
// rejection sample p with x removed.
//
// Drafters: ModelDrafter (model_drafter.h, a smaller model with its own KV
// cache) and NgramDrafter (prompt lookup, ngram_drafter.h). See docs/speculative.md.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "decode/decoder.h"
#include "decode/generate.h"
#include "sampling/sampler.h"
#include "speculation/draft_verification.h"
#include "speculation/drafter.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

struct SpeculativeStats {
  int64_t target_passes = 0;  // verification forward passes (one per round)
  int64_t proposed = 0;       // draft tokens proposed
  int64_t accepted = 0;       // draft tokens accepted
  int64_t generated = 0;      // tokens produced by rounds (accepted + one per round)
  double acceptance_rate() const { return proposed ? static_cast<double>(accepted) / proposed : 0.0; }
  // Mean tokens each target pass yields (1 without speculation).
  double tokens_per_pass() const { return target_passes ? static_cast<double>(generated) / target_passes : 0.0; }
};

// The draft / verify / roll-back round for one sequence. The target decoder
// always holds history minus its last token: that token goes into the next
// verification batch ahead of the drafts, so one pass scores all of them.
class SpeculativeSession {
 public:
  SpeculativeSession(Decoder& target, Drafter& drafter, Sampler& sampler);
  // Resets both sides and prefills the prompt. Throws kvserve::Error when the
  // prompt is empty or does not fit the target's context.
  void start(std::span<const int32_t> prompt);
  // One round with at most k drafts (fewer near the end of the context):
  // returns the 1..k+1 new tokens, already appended to history().
  std::span<const int32_t> step(int64_t k);
  std::span<const int32_t> history() const { return history_; }
  // Tokens the target can still take, counting the pending last one.
  int64_t room() const { return target_.max_context() - static_cast<int64_t>(history_.size()) + 1; }
  const SpeculativeStats& stats() const { return stats_; }

 private:
  Decoder& target_;
  Drafter& drafter_;
  Sampler& sampler_;
  std::vector<int32_t> history_;
  DraftProposal proposal_;
  std::vector<int32_t> batch_;     // pending token + drafts
  std::vector<int32_t> produced_;  // this round's new tokens
  VerifyScratch scratch_;
  SpeculativeStats stats_;
};

struct SpeculativeOptions {
  int64_t draft_k = 5;     // drafts per round (the ceiling when adaptive)
  bool adaptive_k = false; // grow k after a fully accepted round, shrink it after a poor one
  int64_t max_new_tokens = 128;
  bool stop_at_end_of_generation = true;
};

struct SpeculativeResult {
  GenerateResult generation;
  SpeculativeStats stats;
};

// generate() with speculation: same tokens for greedy, same distribution when
// sampling. on_token is called for each token in order; false stops.
SpeculativeResult generate_speculative(Decoder& target, Drafter& drafter, Sampler& sampler,
                                       const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                       const SpeculativeOptions& options,
                                       const std::function<bool(int32_t)>& on_token);

}  // namespace kvserve

