#pragma once
// Speculative decoding inside the batching engine, one request's side: the
// drafter's proposals (prompt lookup, or a draft model), their verification
// with the exact rule shared with SpeculativeSession (verify_draft), adaptive
// k, and the settings' validation. The scheduler places the drafts in the
// batch (Scheduler::schedule with a DraftSource) and rolls rejected ones back
// (Scheduler::resolve_drafts); the engine's step joins the two (engine/sampling_stage.cpp verifies).
//
// Draft-model mode: a proposal is made in two phases (draft_model_batch.h):
// propose() reserves the sequence's draft K/V and returns k placeholders that
// the scheduler places in the batch; the engine then runs every such
// sequence's draft passes together and fills the proposal in
// (pending_proposal(), drafts_computed()) before the target's pass verifies it.
//
// Auto mode: each step chooses the source (prompt lookup, or the draft model
// when the engine has one) and k, 0 included, with the engine's step cost and
// this request's acceptance of each source (speculation_policy.h). Prompt lookup's
// acceptance is also learned while it is not used: its proposal is kept as a
// "shadow" and compared with the tokens the step produced (free: greedy
// accepts a token exactly when it is the one produced, and sampling accepts a
// one-hot draft x with probability p(x), the chance of producing x).
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sampling/sampler.h"
#include "speculation/draft_model_batch.h"
#include "speculation/draft_verification.h"
#include "speculation/ngram_drafter.h"
#include "speculation/speculation_policy.h"
#include "speculation/speculation_settings.h"

namespace kvserve {

constexpr int64_t kMaxEngineDraftK = 32;

// Throws kvserve::Error for settings the engine cannot run: draft-model mode
// without a draft model, or draft_k outside [1, kMaxEngineDraftK] with
// speculation on. Auto mode runs without a draft model (prompt lookup only).
void validate_speculation(const SpeculationSettings& settings, bool has_draft_model);

// "none", "ngram", "draft" or "auto"; throws kvserve::Error naming the choices.
SpeculativeMode parse_speculative_mode(const std::string& name);
const char* speculative_mode_name(SpeculativeMode mode);

// What a request's speculation draws on: the engine's draft model and its
// paged K/V (null: none), and the engine's policy state for auto mode (null:
// no auto).
struct SpeculationContext {
  DraftModelBatch* draft = nullptr;
  SpeculationPolicy* policy = nullptr;
};

class RequestSpeculation {
 public:
  // `context.draft` is used in draft-model and auto mode only;
  // validate_speculation has checked that there is one in draft-model mode.
  // Auto mode needs context.policy with a measured step cost.
  RequestSpeculation(const SpeculationSettings& settings, const SpeculationContext& context);
  bool enabled() const { return settings_.mode != SpeculativeMode::kNone; }
  // At most min(k, max_drafts) drafts to follow `history` (prompt + generated)
  // of sequence `seq`, kept until verify(); none when speculation is off or
  // nothing matches. From the draft model: placeholders until the engine runs
  // the draft passes (drafts_pending()). For auto mode: `batch_tokens`, the
  // step's tokens without these drafts (this sequence's included), and
  // `remaining_tokens`, what the request may still generate.
  std::span<const int32_t> propose(SequenceId seq, std::span<const int32_t> history, int64_t max_drafts,
                                   int64_t batch_tokens, int64_t remaining_tokens, Sampler& sampler);
  // Keeps only the first n drafts of the last proposal, for a deterministic
  // drafter only (cutting a sampled proposal would bias the output).
  void keep_first(int64_t n);
  bool proposal_deterministic() const { return !drafts_pending_ && proposal_.deterministic(); }
  // The last proposal awaits the draft model's passes: the engine fills
  // pending_proposal() in (DraftModelBatch::run), then calls drafts_computed().
  bool drafts_pending() const { return drafts_pending_; }
  DraftProposal& pending_proposal() { return proposal_; }
  void drafts_computed() { drafts_pending_ = false; }
  // Verifies the last proposal's n_draft drafts against the target's rows
  // [n_draft + 1][vocab] (row i after history and the first i drafts):
  // `produced` gets the round's 1..n_draft+1 tokens; returns the drafts
  // accepted. Adapts k when adaptive.
  int64_t verify(std::span<const float> rows, int64_t n_draft, std::span<const int32_t> history, Sampler& sampler,
                 VerifyScratch& scratch, std::vector<int32_t>& produced);

 private:
  enum class Source { kNgram, kModel };
  void propose_from(Source source, SequenceId seq, std::span<const int32_t> history, int64_t k, Sampler& sampler);
  std::span<const int32_t> propose_auto(SequenceId seq, std::span<const int32_t> history, int64_t max_drafts,
                                        int64_t batch_tokens, int64_t remaining_tokens, Sampler& sampler);
  // Compares the last shadow proposal with what followed it in `history`.
  void settle_shadow(std::span<const int32_t> history);
  // Prompt lookup's acceptance for a match of n tokens (1..3).
  AcceptanceRate& ngram_rate(int64_t match) { return ngram_rates_.at(static_cast<size_t>(match - 1)); }

  SpeculationSettings settings_;
  SpeculationContext context_;
  int64_t k_;  // drafts of the next round at most (draft_k unless adaptive)
  NgramDrafter ngram_;
  DraftProposal proposal_;
  bool drafts_pending_ = false;  // proposal_ holds the draft model's placeholders
  Source source_ = Source::kNgram;  // of proposal_
  // Auto mode:
  // One estimate per match length n = 1, 2, 3: a one-token match is a guess, a
  // three-token one usually a copy.
  std::vector<AcceptanceRate> ngram_rates_{AcceptanceRate(0.3, 2.0), AcceptanceRate(0.5, 2.0), AcceptanceRate(0.6, 2.0)};
  AcceptanceRate draft_rate_{0.6, 4.0};  // its prior: SpeculationPolicy::draft_model_prior()
  DraftProposal shadow_;                 // an unused prompt-lookup proposal, checked against what came next
  size_t shadow_at_ = 0;                 // the history length it followed
  int64_t shadow_match_ = 0;             // its match length n
  int64_t proposal_match_ = 0;           // the match length of a prompt-lookup proposal_
};

}  // namespace kvserve
