// quantize_q8_activations with AVX-512: one block of 32 values is two 512-bit
// vectors. Bit-identical to the scalar loop in matmul.cpp (the same float
// operations in the same order; the conversion rounds to nearest even, as
// nearbyint does in the default rounding mode), which a test checks.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (see matmul_avx512.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/kernel_table.h"

namespace kvserve {

void quantize_q8_activations_avx512(const float* x, int64_t cols, Q8Order order, uint8_t* dst) {
  auto* qs = reinterpret_cast<int8_t*>(dst);
  auto* scales = reinterpret_cast<Q8ActScale*>(dst + q8_act_qs_bytes(cols));
  const int64_t n_blocks = cols / 32;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + b * 32), hi = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float d = amax / 127.0f;
    const __m512 inv_d = _mm512_set1_ps(d != 0 ? 1.0f / d : 0.0f);
    const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv_d));
    const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv_d));
    const Q8HalfOffsets at = q8_half_offsets(order, b, n_blocks);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + at.first), _mm512_cvtepi32_epi8(q_lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + at.second), _mm512_cvtepi32_epi8(q_hi));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
    scales[b] = {d, d * static_cast<float>(sum)};
  }
}

}  // namespace kvserve
