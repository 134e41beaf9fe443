// AVX2 + FMA SiLU-gate: gate[i] = silu(gate[i]) * up[i] with a polynomial
// exp (Cephes' expf: range reduction by ln 2, degree-5 polynomial, ~1 ulp).
// The scalar silu_mul (ops.cpp, std::exp) stays the reference. Every element
// takes the same instructions wherever it sits (a short tail goes through the
// same 8-wide code via a padded copy), so results do not depend on n, on the
// OpenMP split or on the batch: what batch invariance needs.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kvserve {
namespace {

__m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365447505f)), _mm256_set1_ps(88.3762626647949f));
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split in two for an exact n ln2
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
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // times 2^n, built in the exponent field
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__m256 silu_times(__m256 g, __m256 u) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

}  // namespace

void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gate + i, silu_times(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i == n) return;
  float g[8] = {}, u[8] = {};
  const auto rest = static_cast<size_t>(n - i);
  std::memcpy(g, gate + i, rest * sizeof(float));
  std::memcpy(u, up + i, rest * sizeof(float));
  _mm256_storeu_ps(g, silu_times(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
  std::memcpy(gate + i, g, rest * sizeof(float));
}

}  // namespace kvserve
