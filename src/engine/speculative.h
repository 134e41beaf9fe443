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
// Drafters: ModelDrafter (a smaller model with its own KV cache) and
// NgramDrafter (prompt lookup, ngram_draft.h). See docs/speculative.md.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/decoder.h"
#include "engine/generate.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

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
// SpeculativeSession and the batching engine (batch_speculation.h).
int64_t verify_draft(std::span<const float> target_rows, const DraftProposal& proposal,
                     std::span<const int32_t> history, Sampler& sampler, VerifyScratch& scratch,
                     std::vector<int32_t>& produced);

// Adaptive k: one more draft after a fully accepted round (up to max_k), one
// fewer when under half of the drafts survive (down to 1).
int64_t adapt_draft_k(int64_t k, int64_t proposed, int64_t accepted, int64_t max_k);

struct SpeculativeStats {
  int64_t target_passes = 0;  // verification forward passes (one per round)
  int64_t proposed = 0;       // draft tokens proposed
  int64_t accepted = 0;       // draft tokens accepted
  int64_t generated = 0;      // tokens produced by rounds (accepted + one per round)
  double acceptance_rate() const { return proposed ? static_cast<double>(accepted) / proposed : 0.0; }
  // Mean tokens each target pass yields (1 without speculation).
  double tokens_per_pass() const { return target_passes ? static_cast<double>(generated) / target_passes : 0.0; }
  // Mean draft tokens accepted per target pass.
  double accepted_per_pass() const { return target_passes ? static_cast<double>(accepted) / target_passes : 0.0; }
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
