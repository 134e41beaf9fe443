// The gated activations with AVX2 + FMA: 8 values a step through a polynomial
// exp. The scalar loops in ops.cpp took a fifth of Gemma 3 270M's prefill
// (GELU: libm tanhf, which calls expm1f) and 8% of Qwen2.5-Coder-0.5B's
// (SiLU: libm expf); perf, Zen 4, pp512.
#include <immintrin.h>

#include <cstring>

#include "kernels/ops.h"

namespace kvserve {
namespace {

// e^x for x in [-87.3, 88.3] (clamped there), within ~2 ulp: x = n ln2 + r,
// |r| <= ln2 / 2, e^r by Cephes expf's polynomial, 2^n from the exponent bits.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

// gelu_tanh(x) * up = x sigmoid(2u) * up with u = sqrt(2/pi) (x + 0.044715 x^3):
// 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), which has no cancellation where
// tanh(u) nears -1 (the scalar form loses relative precision there).
inline __m256 gelu_tanh_mul8(__m256 x, __m256 up) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x);
  const __m256 minus_2u = _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608028654f), inner);
  const __m256 g = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(minus_2u)));
  return _mm256_mul_ps(g, up);
}

// silu(x) * up = x / (1 + e^(-x)) * up.
inline __m256 silu_mul8(__m256 x, __m256 up) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), up);
}

// gate[i] = f8(gate[i..i+8), up[i..i+8)) over [0, n).
template <typename F8>
void gated(float* gate, const float* up, int64_t n, F8 f8) {
  const int64_t steps = n / 8;
#pragma omp parallel for schedule(static) if (n >= kOpsParallelElements)
  for (int64_t s = 0; s < steps; ++s)
    _mm256_storeu_ps(gate + 8 * s, f8(_mm256_loadu_ps(gate + 8 * s), _mm256_loadu_ps(up + 8 * s)));
  // The last n % 8 values through the same 8-wide code: each value's result
  // does not depend on where it sits in the array.
  if (const int64_t rest = n - 8 * steps; rest > 0) {
    float g[8] = {}, u[8] = {};
    std::memcpy(g, gate + 8 * steps, sizeof(float) * static_cast<size_t>(rest));
    std::memcpy(u, up + 8 * steps, sizeof(float) * static_cast<size_t>(rest));
    _mm256_storeu_ps(g, f8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
    std::memcpy(gate + 8 * steps, g, sizeof(float) * static_cast<size_t>(rest));
  }
}

}  // namespace

void gelu_tanh_mul_avx2(float* gate, const float* up, int64_t n) { gated(gate, up, n, gelu_tanh_mul8); }

void silu_mul_avx2(float* gate, const float* up, int64_t n) { gated(gate, up, n, silu_mul8); }

}  // namespace kvserve
