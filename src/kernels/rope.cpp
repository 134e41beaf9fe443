#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace kvserve {

namespace {
// ggml_rope_yarn_corr_dim: the pair index whose wavelength fits n_rot times in the original context.
float yarn_corr_dim(int64_t n_dims, int64_t original_context, double n_rot, double base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(original_context) / (static_cast<float>(n_rot) * 2.0f * 3.14159265358979f)) /
         (2.0f * std::log(static_cast<float>(base)));
}
}  // namespace

std::vector<double> yarn_pair_multipliers(const RopeParams& p) {
  const int64_t pairs = p.rot_dims / 2;
  std::vector<double> m(static_cast<size_t>(pairs), 1.0);
  if (p.yarn.ext_factor == 0.0) return m;
  if (p.yarn.original_context <= 0) throw Error("rope: YaRN needs the original context length");
  const float low = std::max(0.0f, std::floor(yarn_corr_dim(p.rot_dims, p.yarn.original_context, p.yarn.beta_fast, p.theta)));
  const float high = std::min(static_cast<float>(p.rot_dims - 1),
                              std::ceil(yarn_corr_dim(p.rot_dims, p.yarn.original_context, p.yarn.beta_slow, p.theta)));
  for (int64_t i = 0; i < pairs; ++i) {
    const float y = (static_cast<float>(i) - low) / std::max(0.001f, high - low);
    const double ramp = (1.0 - std::min(1.0f, std::max(0.0f, y))) * p.yarn.ext_factor;
    // theta = interp * (1 - ramp) + extrap * ramp, interp = extrap * position_scale; inv_freq already holds the scale.
    m[static_cast<size_t>(i)] = (1.0 - ramp) + ramp / p.position_scale;
  }
  return m;
}

RopeTable::RopeTable(const RopeParams& p)
    : rot_dims_(p.rot_dims), magnitude_(static_cast<float>(p.magnitude)), neox_(p.neox) {
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
  if (!(p.magnitude > 0.0) || !std::isfinite(p.magnitude)) throw Error("rope: the magnitude must be positive and finite");
  if (p.yarn.ext_factor != 0.0) {
    const std::vector<double> m = yarn_pair_multipliers(p);
    for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] *= m[i];
  }
}

void RopeTable::angles(int64_t pos, float* cs) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double angle = static_cast<double>(pos) * inv_freq_[i];
    cs[2 * i] = static_cast<float>(std::cos(angle)) * magnitude_;
    cs[2 * i + 1] = static_cast<float>(std::sin(angle)) * magnitude_;
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
