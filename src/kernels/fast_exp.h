#pragma once
// exp(x) for the attention softmax, as a polynomial that vectorizes: the
// scalar std::exp of every score cost more than the K/V reads at long
// context (4K keys x 9 heads x 30 layers: 1.1 M calls per SmolLM2 token,
// docs/performance.md "Long context"). Cephes' expf: n = round(x log2 e),
// r = x - n ln 2 (in two parts, so n ln 2 is exact), e^r by a degree-6
// polynomial, times 2^n from the exponent bits. Within 2 ulp of exp over
// [-87.33, 88.37]; 0 below (e^x < FLT_MIN), +inf above, NaN stays NaN.
//
// This scalar version is the reference: the AVX2 and AVX-512 lanes
// (kv_quant_avx2.cpp, kv_quant_avx512.cpp) run the same operations in the
// same order (fused multiply-adds, round to nearest even) and give the same
// bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kvserve::fast_exp {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;        // few bits: n * kLn2Hi is exact
constexpr float kLn2Lo = -2.12194440e-4f;     // ln 2 - kLn2Hi
constexpr float kMinInput = -87.3365448f;     // e^x below FLT_MIN: 0
constexpr float kMaxInput = 88.3762626f;      // 127.5 / log2 e: n stays a finite exponent; +inf above
constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp_scalar(float x) {
  if (std::isnan(x)) return x;
  if (x < kMinInput) return 0.0f;  // also -inf
  if (x > kMaxInput) return std::numeric_limits<float>::infinity();
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kPoly[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kPoly[i]);
  const float e_r = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return e_r * two_n;
}

// One row of scores, in order, as the attention ops' scale_max and exp_sum
// (kv_quant.h) define them: the scalar table's ops, and the SIMD ops' tails,
// which pass in what their lanes found so far.
inline float scale_max_scalar(float* x, int64_t n, float scale, float max = -std::numeric_limits<float>::infinity()) {
  for (int64_t j = 0; j < n; ++j) {
    x[j] *= scale;
    max = std::max(max, x[j]);
  }
  return max;
}
inline float exp_sum_scalar(float* x, int64_t n, float shift, float sum = 0.0f) {
  for (int64_t j = 0; j < n; ++j) {
    x[j] = exp_scalar(x[j] - shift);
    sum += x[j];
  }
  return sum;
}

}  // namespace kvserve::fast_exp
