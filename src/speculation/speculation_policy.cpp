#include "speculation/speculation_policy.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

namespace {
// Weight of the newest observation in AcceptanceRate and in the policy's
// averages (older ones fade by 1 - this per observation): about the last ten count.
constexpr double kNewest = 0.1;
}  // namespace

AcceptanceRate::AcceptanceRate(double prior, double prior_weight) : prior_(prior), prior_weight_(prior_weight) {}

void AcceptanceRate::observe(int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  accepted_ = (1 - kNewest) * accepted_ + static_cast<double>(accepted);
  rejected_ = (1 - kNewest) * rejected_ + (accepted < proposed ? 1.0 : 0.0);
  rounds_++;
}

void AcceptanceRate::set_prior(double prior) { prior_ = std::clamp(prior, 0.0, 1.0); }

double AcceptanceRate::rate() const {
  return (accepted_ + prior_ * prior_weight_) / (accepted_ + rejected_ + prior_weight_);
}

double expected_round_tokens(double acceptance, int64_t k) {
  double term = 1, sum = 1;
  for (int64_t i = 0; i < k; ++i) sum += (term *= acceptance);
  return sum;
}

DraftChoice choose_draft_length(const StepCost& cost, double acceptance, int64_t batch_tokens, int64_t max_k,
                                double draft_seconds_per_token, double min_gain, double fixed_draft_seconds) {
  check(batch_tokens >= 1, "the batch holds this sequence's token");
  const auto others = static_cast<double>(batch_tokens - 1);
  const auto rate = [&](int64_t k) {
    return (others + expected_round_tokens(acceptance, k)) /
           (cost.seconds(batch_tokens + k) + static_cast<double>(k) * draft_seconds_per_token +
            (k > 0 ? fixed_draft_seconds : 0.0));
  };
  const double base = rate(0);
  DraftChoice best;
  for (int64_t k = 1; k <= max_k; ++k) {
    const double gain = rate(k) / base;
    if (gain > best.gain * (1 + 1e-9)) best = {k, gain};
  }
  if (best.gain < min_gain) return {};
  return best;
}

double amortized_catch_up_seconds(double catch_up_seconds, double acceptance, int64_t k, int64_t remaining_tokens) {
  const double rounds = static_cast<double>(std::max<int64_t>(remaining_tokens, 1)) /
                        expected_round_tokens(acceptance, std::max<int64_t>(k, 1));
  return catch_up_seconds / std::clamp(rounds, 1.0, static_cast<double>(kCatchUpRounds));
}

namespace {
// The first observation, then a moving average.
double averaged(double current, double observed) {
  return current == 0 ? observed : (1 - kNewest) * current + kNewest * observed;
}
}  // namespace

void SpeculationPolicy::observe_draft_seconds(double seconds_per_pass) {
  if (seconds_per_pass > 0) draft_seconds_per_pass = averaged(draft_seconds_per_pass, seconds_per_pass);
}

double SpeculationPolicy::draft_model_prior() const {
  const double learned = draft_model_acceptance.rate();
  return draft_model_acceptance.rounds() < kDraftProbeRounds ? std::max(learned, kProbeDraftAcceptance) : learned;
}

void SpeculationPolicy::observe_catch_up_seconds(double seconds_per_token) {
  if (seconds_per_token > 0) catch_up_seconds_per_token = averaged(catch_up_seconds_per_token, seconds_per_token);
}

}  // namespace kvserve
