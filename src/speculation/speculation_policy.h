#pragma once
// `--spec auto` (docs/speculative.md, "Speculation that decides for itself"):
// whether a decoding sequence drafts this step, from which source, and how
// many tokens. A draft of k tokens that each survive with probability a yields
// E(k) = 1 + a + ... + a^k tokens for the sequence instead of 1, and makes the
// step's batch k tokens longer (plus k draft-model passes, when the draft
// comes from a model). The choice maximizes the step's useful tokens per
// second:
//     (U + E(k)) / (t(B + k) + k * d)
// where B is the batch's tokens without this sequence's drafts, U = B - 1 the
// other tokens it holds (other sequences' decode tokens and prefill), t(n) the
// measured cost of a forward pass over n tokens and d the draft model's cost
// per drafted token (0 for prompt lookup). On a CPU t(n) is nearly linear once
// the kernels are compute-bound, so a big batch mostly chooses k = 0 and a
// lone request on text that repeats its prompt a large k.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <vector>

#include "speculation/speculation_settings.h"  // kMinDraftGain
#include "speculation/step_cost.h"

namespace kvserve {

// A per-token acceptance probability estimated from verification rounds and
// pulled toward a prior when evidence is old: each observation decays the
// counts before adding to them, so a request whose text changes character is
// re-learned within a few dozen rounds.
class AcceptanceRate {
 public:
  explicit AcceptanceRate(double prior = 0.5, double prior_weight = 2.0);
  // `accepted` of `proposed` drafts survived; a rejection ended the round
  // unless every draft was accepted (a round cut short tells nothing past it).
  void observe(int64_t proposed, int64_t accepted);
  void set_prior(double prior);
  double rate() const;
  int64_t rounds() const { return rounds_; }

 private:
  double prior_;
  double prior_weight_;
  double accepted_ = 0;
  double rejected_ = 0;
  int64_t rounds_ = 0;
};

// 1 + a + a^2 + ... + a^k: the tokens a round with k drafts yields on average.
double expected_round_tokens(double acceptance, int64_t k);

struct DraftChoice {
  int64_t k = 0;       // drafts to propose (0: decode one token as usual)
  double gain = 1.0;   // useful tokens per second with k drafts over that with none
};

// The k in [0, max_k] maximizing (B - 1 + E(k)) / (t(B + k) + k * draft_seconds + fixed),
// B = batch_tokens >= 1, or 0 when the best k's gain is under min_gain.
// fixed_draft_seconds: paid once by any k > 0 (a draft model catching up
// with the history it has not seen). Ties go to the smaller k.
DraftChoice choose_draft_length(const StepCost& cost, double acceptance, int64_t batch_tokens, int64_t max_k,
                                double draft_seconds_per_token, double min_gain = kMinDraftGain,
                                double fixed_draft_seconds = 0);

// A draft model that has caught up with a sequence stays caught up while it
// keeps drafting (each round then feeds it the round's last token or two), so
// its catch-up is an investment in the rounds that follow: spread over the
// rounds it is expected to draft, the request's remaining tokens over E(k)
// but at most kCatchUpRounds (auto may turn back to prompt lookup). Charged in
// full to one step, it grew with every token the draft model missed and auto
// never chose the draft model again (Qwen2.5-Coder pair, code: auto 1.04x
// where the draft model alone gave 1.14x).
constexpr int64_t kCatchUpRounds = 4;
double amortized_catch_up_seconds(double catch_up_seconds, double acceptance, int64_t k, int64_t remaining_tokens);

// What the engine learns about speculation across requests: the step cost,
// the draft model's cost per drafted token and its acceptance over all
// requests (the prior of each new request's own estimate).
struct SpeculationPolicy {
  StepCost step_cost;
  // d: seconds of one draft pass (one draft position of every drafting sequence), measured at the first
  // draft-model proposal, then averaged; a sequence drafting k tokens is charged k d.
  double draft_seconds_per_pass = 0;
  // The draft model's seconds per history token it catches up on (fed in
  // chunks, so far cheaper per token than drafting), from runs that fed more
  // history than drafts; 0 until one is seen.
  double catch_up_seconds_per_token = 0;
  AcceptanceRate draft_model_acceptance{0.6, 4.0};
  double min_draft_gain = kMinDraftGain;
  // Until the engine has seen kDraftProbeRounds draft-model rounds, a request
  // judges the draft model on at least kProbeDraftAcceptance: the draft
  // model's acceptance is only learned by drafting (prompt lookup's is
  // checked for free, the draft model's costs passes), and the 0.6 prior alone
  // never promised a gain where verification is dear, so it was never tried.
  static constexpr int64_t kDraftProbeRounds = 8;
  static constexpr double kProbeDraftAcceptance = 0.9;
  // The prior of a request's own draft-model acceptance.
  double draft_model_prior() const;
  void observe_draft_seconds(double seconds_per_pass);
  void observe_catch_up_seconds(double seconds_per_token);
};

}  // namespace kvserve
