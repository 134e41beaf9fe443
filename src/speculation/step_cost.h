#pragma once
// t(n), the measured cost of one engine step over n tokens: what auto
// speculation (speculation_policy.h) weighs a draft's tokens against.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvserve {

// t(n): seconds of one step over a batch of n tokens, linear between
// measured points and extended past the last one with its last slope. The
// engine's steps correct it twice: a multiplicative correction follows a host
// that gets slower or faster after the measurement, and a slower one per
// point learns the shape the start-up passes missed (they run at a short
// context and leave out sampling and verification: SmolLM2's real t(2) / t(1)
// was 1.21 where start-up measured 1.12, and auto's one-token guesses lost).
class StepCost {
 public:
  // Points (n, seconds) with n >= 1, any order; an empty list leaves the cost
  // unmeasured. Throws kvserve::Error for n < 1 or a non-positive time.
  // learn_shape false: the points' shape is kept as given (a cost set by hand,
  // as tests do), only the host's correction applies.
  void set_points(std::vector<std::pair<int64_t, double>> points, bool learn_shape = true);
  bool measured() const { return !points_.empty(); }
  double seconds(int64_t n) const;
  // One step over n tokens took `seconds`: moves the correction toward it.
  void observe(int64_t n, double seconds);
  const std::vector<std::pair<int64_t, double>>& points() const { return points_; }

 private:
  double model_seconds(int64_t n) const;

  // The points around n and the weight of the upper one (0 or 1 outside them).
  struct Segment {
    size_t lo, hi;
    double w_hi;
  };
  Segment segment(int64_t n) const;

  std::vector<std::pair<int64_t, double>> points_;  // sorted by n, one per n
  std::vector<double> shape_;                       // each point's learned correction
  bool learn_shape_ = true;
  double correction_ = 1.0;
};

// "t(1) 30.1 ms, t(2) 31.0 ms, ..." for logs.
std::string format_step_cost(const std::vector<std::pair<int64_t, double>>& points);

}  // namespace kvserve
