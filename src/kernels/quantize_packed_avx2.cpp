// quantize_packed_activations with AVX2: 8 values a step. The same bytes as
// the scalar loop in repack.cpp (max|x| is exact in any order, x * (1 / d)
// is the same float multiply, and the conversion rounds to nearest even as
// nearbyint does in the default rounding mode; the sums are integers), which
// PackedActivations.SimdMatchesScalarBytes checks. It was 5% of
// Qwen2.5-Coder-0.5B's prefill as a scalar loop (perf, Zen 4, pp512).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/repack.h"

namespace kvserve {
namespace {

float max_abs(const float* x, int n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// q[0..32) = round(x[0..32) * refine * inv_d), refine[0] for the first 16 values
// and refine[1] for the next (powers of two, exact); returns the 8 sums of 4
// consecutive q.
__m256i quantize32(const float* x, const __m256 (&refine)[2], __m256 inv_d, int8_t* q) {
  __m256i v[4];
  for (int k = 0; k < 4; ++k)
    v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), refine[k / 2]), inv_d));
  // packs interleave 128-bit lanes: [0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31] as dwords of bytes
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), ordered), _mm256_set1_epi16(1));
}

// repack.cpp's quantize_block32: q = round((x 2^k_h) / d) per 16-value half h.
PackedAct32 quantize_block32(const float* x, int8_t* q) {
  const float half_max[2] = {max_abs(x, 16), max_abs(x + 16, 16)};
  PackedAct32 a{};
  const float inv_d = packed_act_scale(half_max, 2, &a.d, a.shift);
  __m256 refine[2];
  for (int h = 0; h < 2; ++h) refine[h] = _mm256_set1_ps(static_cast<float>(1 << (3 - a.shift[h])));
  alignas(32) int32_t sums4[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sums4), quantize32(x, refine, _mm256_set1_ps(inv_d), q));
  a.sum = at_block_scale(sums4[0] + sums4[1] + sums4[2] + sums4[3], a.shift[0]) +
          at_block_scale(sums4[4] + sums4[5] + sums4[6] + sums4[7], a.shift[1]);
  a.s = a.d * static_cast<float>(a.sum);
  return a;
}

// repack.cpp's quantize_super_block: q = round((x 2^k_j) / d) per sub-block j.
PackedAct256 quantize_super_block(const float* x, int8_t* q) {
  float sub_max[8];
  for (int j = 0; j < 8; ++j) sub_max[j] = max_abs(x + 32 * j, 32);
  PackedAct256 a{};
  const float inv_d = packed_act_scale(sub_max, 8, &a.d, a.shift);
  for (int j = 0; j < 8; ++j) {
    const int32_t shift = a.shift[j];
    const __m256 sub_refine = _mm256_set1_ps(static_cast<float>(1 << (3 - shift)));
    const __m256 refine[2] = {sub_refine, sub_refine};
    alignas(32) int32_t sums4[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums4), quantize32(x + 32 * j, refine, _mm256_set1_ps(inv_d), q + 32 * j));
    a.sum16[2 * j] = static_cast<int16_t>(at_block_scale(sums4[0] + sums4[1] + sums4[2] + sums4[3], shift));
    a.sum16[2 * j + 1] = static_cast<int16_t>(at_block_scale(sums4[4] + sums4[5] + sums4[6] + sums4[7], shift));
    a.sum32[j] = static_cast<int16_t>(a.sum16[2 * j] + a.sum16[2 * j + 1]);
  }
  return a;
}

}  // namespace

void quantize_packed_activations_avx2(DType type, const float* x, int64_t cols, uint8_t* dst) {
  auto* qs = reinterpret_cast<int8_t*>(dst);
  uint8_t* blocks = dst + packed_act_qs_bytes(cols);
  if (packed_act_is_256(type)) {
    for (int64_t b = 0; b < cols / 256; ++b) {
      const PackedAct256 a = quantize_super_block(x + b * 256, qs + b * 256);
      std::memcpy(blocks + static_cast<size_t>(b) * sizeof(a), &a, sizeof(a));
    }
    return;
  }
  for (int64_t b = 0; b < cols / 32; ++b) {
    const PackedAct32 a = quantize_block32(x + b * 32, qs + b * 32);
    std::memcpy(blocks + static_cast<size_t>(b) * sizeof(a), &a, sizeof(a));
  }
}

}  // namespace kvserve
