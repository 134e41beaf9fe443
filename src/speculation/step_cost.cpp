#include "speculation/step_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace kvserve {

namespace {
// Weight of the newest step in the host's correction (older ones fade by
// 1 - this per observation): about the last ten steps count.
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

}  // namespace kvserve
