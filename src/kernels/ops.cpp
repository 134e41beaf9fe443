#include "kernels/ops.h"

#include <cmath>
#include <limits>

#include "kernels/dispatch.h"

namespace kvserve {

void rmsnorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t pos, float theta, bool neox) {
  for (int64_t i = 0; i < rot_dims / 2; ++i) {
    const double freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(rot_dims));
    const double angle = static_cast<double>(pos) * freq;
    const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + h * head_dim;
      const int64_t a = neox ? i : 2 * i;
      const int64_t b = neox ? i + rot_dims / 2 : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

// Element-wise ops split over the OpenMP threads when a batch makes them
// long enough to pay for a parallel region (a few microseconds,
// kOpsParallelElements); each element is computed the same way either way.

void rmsnorm_rows(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kOpsParallelElements)
  for (int64_t r = 0; r < rows; ++r) rmsnorm(x + r * dim, weight, dim, eps, out + r * dim);
}

void silu_mul(float* gate, const float* up, int64_t n) {
#if KVSERVE_HAVE_SIMD
  if (active_isa() != Isa::Scalar) return silu_mul_avx2(gate, up, n);
#endif
  silu_mul_scalar(gate, up, n);
}

void silu_mul_scalar(float* gate, const float* up, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kOpsParallelElements)
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
#if KVSERVE_HAVE_SIMD
  if (active_isa() != Isa::Scalar) return gelu_tanh_mul_avx2(gate, up, n);
#endif
  gelu_tanh_mul_scalar(gate, up, n);
}

void gelu_tanh_mul_scalar(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
#pragma omp parallel for schedule(static) if (n >= kOpsParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    gate[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void softmax(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::fmax(max, x[i]);
  if (max == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0;
    return;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void add_inplace(float* x, const float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kOpsParallelElements)
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace kvserve
