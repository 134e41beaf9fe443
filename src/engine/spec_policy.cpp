#include "engine/spec_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace kvserve {

namespace {
// Weight of the newest step in StepCost's correction, and of the newest round
// in AcceptanceRate (older ones fade by 1 - this per observation): about the
// last ten of each count.
constexpr double kNewest = 0.1;
// Weight of the newest step in a point's shape correction: slower than the
// host's, so that a passing slowdown lands there and not in the shape.
constexpr double kShapeNewest = 0.05;
}  // namespace

void StepCost::set_points(std::vector<std::pair<int64_t, double>> points, bool learn_shape) {
  for (const auto& [n, s] : points)
    if (n < 1 || !(s > 0) || !std::isfinite(s))
      throw Error("a step cost point needs n >= 1 and a positive time, got n " + std::to_string(n));
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
               points.end());
  points_ = std::move(points);
  shape_.assign(points_.size(), 1.0);
  learn_shape_ = learn_shape;
  correction_ = 1.0;
}

StepCost::Segment StepCost::segment(int64_t n) const {
  check(!points_.empty(), "a step cost is measured before use");
  if (points_.size() == 1) return {0, 0, 1.0};
  // The segment holding n, or the first / last one to extend.
  size_t hi = 1;
  while (hi + 1 < points_.size() && points_[hi].first < n) hi++;
  const double span = static_cast<double>(points_[hi].first - points_[hi - 1].first);
  return {hi - 1, hi, std::clamp(static_cast<double>(n - points_[hi - 1].first) / span, 0.0, 1.0)};
}

double StepCost::model_seconds(int64_t n) const {
  const Segment s = segment(n);
  const auto [n0, t0] = points_[s.lo];
  const double c0 = t0 * shape_[s.lo];
  if (s.lo == s.hi) return c0 * static_cast<double>(n) / static_cast<double>(n0);  // one point: proportional
  const auto n1 = points_[s.hi].first;
  const double c1 = points_[s.hi].second * shape_[s.hi];
  const double slope = (c1 - c0) / static_cast<double>(n1 - n0);
  return std::max(c0 + slope * static_cast<double>(n - n0), 0.1 * points_[0].second);
}

double StepCost::seconds(int64_t n) const { return correction_ * model_seconds(n); }

void StepCost::observe(int64_t n, double seconds) {
  if (points_.empty() || n < 1 || !(seconds > 0)) return;
  // One stalled step (a page fault storm, another process) moves it at most 4x, and the host's correction
  // stays within 4x of the measurement.
  const double ratio = std::clamp(seconds / this->seconds(n), 0.25, 4.0);
  const double before = correction_;
  correction_ = std::clamp(correction_ * (1 + kNewest * (ratio - 1)), 0.25, 4.0);
  const double host = correction_ / before;
  // Past the last point (a long prefill) the extension, not a point, is off: only the host's factor learns.
  if (!learn_shape_ || n > points_.back().first) return;
  // What the host's correction leaves goes, more slowly, to the points around n.
  const double residual = ratio / host - 1;
  const Segment s = segment(n);
  const auto learn = [&](size_t i, double weight) {
    shape_[i] = std::clamp(shape_[i] * (1 + kShapeNewest * weight * residual), 0.5, 2.0);
  };
  if (s.lo == s.hi) return learn(s.lo, 1.0);
  learn(s.lo, 1 - s.w_hi);
  learn(s.hi, s.w_hi);
}

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

std::string format_step_cost(const std::vector<std::pair<int64_t, double>>& points) {
  std::string out;
  char buffer[64];
  for (const auto& [n, seconds] : points) {
    std::snprintf(buffer, sizeof(buffer), "%st(%lld) %.1f ms", out.empty() ? "" : ", ", static_cast<long long>(n),
                  seconds * 1e3);
    out += buffer;
  }
  return out;
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
