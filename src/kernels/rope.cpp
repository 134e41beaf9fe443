#include "kernels/rope.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace kvserve {

RopeTable::RopeTable(const RopeParams& p) : rot_dims_(p.rot_dims), neox_(p.neox) {
  if (p.rot_dims <= 0 || p.rot_dims % 2 != 0) throw Error("rope: rotated dims must be even and positive");
  const int64_t pairs = p.rot_dims / 2;
  if (!p.freq_factors.empty() && static_cast<int64_t>(p.freq_factors.size()) != pairs)
    throw Error("rope: " + std::to_string(p.freq_factors.size()) + " frequency factors for " + std::to_string(pairs) +
                " dimension pairs");
  inv_freq_.resize(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i) {
    // Written as in ops.cpp's rope() so that an unscaled table rotates bit for bit as it does.
    double f = std::pow(p.theta, -2.0 * static_cast<double>(i) / static_cast<double>(p.rot_dims));
    if (p.position_scale != 1.0) f *= p.position_scale;
    if (!p.freq_factors.empty()) {
      const float factor = p.freq_factors[static_cast<size_t>(i)];
      if (!(factor > 0.0f) || !std::isfinite(factor)) throw Error("rope: frequency factors must be positive and finite");
      f /= static_cast<double>(factor);
    }
    inv_freq_[static_cast<size_t>(i)] = f;
  }
}

void RopeTable::angles(int64_t pos, float* cs) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double angle = static_cast<double>(pos) * inv_freq_[i];
    cs[2 * i] = static_cast<float>(std::cos(angle));
    cs[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
}

void RopeTable::apply(float* x, int64_t n_heads, int64_t head_dim, const float* cs) const {
  const int64_t pairs = rot_dims_ / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t a = neox_ ? i : 2 * i, b = neox_ ? i + pairs : 2 * i + 1;
      const float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace kvserve
