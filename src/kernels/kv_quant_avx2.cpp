// AVX2 versions of the attention inner-loop ops and of the f16 / bf16 / q8_0
// KV row dequantizers (fp8 and q4_0 stay scalar). Without them an AVX2-only
// CPU ran attention's dot products and accumulations in scalar code: a
// quarter of a 256-token SmolLM2 prefill on a Zen 1 core.
#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "kernels/kv_quant.h"

namespace kvserve {
namespace {

float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[r][i .. i + 8 kChunks) += p[r][j] v[j][..] over the keys in order, for
// kRows rows at once (each v chunk loaded once, the rows' y in registers):
// the same multiply-adds per element as axpy.
template <int kRows, int kChunks>
void axpy_keys_block(const float* const* p, const float* const* v, int64_t n_keys, float* const* y, int64_t i) {
  __m256 acc[kRows][kChunks];
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm256_loadu_ps(y[r] + i + 8 * c);
  for (int64_t j = 0; j < n_keys; ++j) {
    __m256 x[kChunks];
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) x[c] = _mm256_loadu_ps(v[j] + i + 8 * c);
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m256 pr = _mm256_set1_ps(p[r][j]);
      #pragma GCC unroll 16
      for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm256_fmadd_ps(pr, x[c], acc[r][c]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) _mm256_storeu_ps(y[r] + i + 8 * c, acc[r][c]);
}

// The row kernels for kRows query rows at once, from which AttentionRowOps
// (kv_quant.h) makes the table's dot, axpy, dot_keys and axpy_keys.
struct KeyKernels {
  // dot(q[r], k[j], n) for kRows rows at once, each key chunk loaded once for
  // the rows. A fixed summation order for a given n: two 8-wide chains, a fixed
  // reduction, then the tail in order (the same for every caller).
  template <int kRows>
  static void dot_rows(const float* const* q, const float* const* k, int64_t n_keys, int64_t n, float* const* out) {
    for (int64_t j = 0; j < n_keys; ++j) {
      const float* kj = k[j];
      __m256 acc0[kRows], acc1[kRows];
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const __m256 k0 = _mm256_loadu_ps(kj + i), k1 = _mm256_loadu_ps(kj + i + 8);
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) {
          acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), k0, acc0[r]);
          acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i + 8), k1, acc1[r]);
        }
      }
      if (i + 8 <= n) {
        const __m256 k0 = _mm256_loadu_ps(kj + i);
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), k0, acc0[r]);
        i += 8;
      }
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        float sum = horizontal_sum(_mm256_add_ps(acc0[r], acc1[r]));
        for (int64_t t = i; t < n; ++t) sum += q[r][t] * kj[t];
        out[r][j] = sum;
      }
    }
  }

  // y[r] += p[r][j] v[j] for every key in order, kRows rows at once.
  template <int kRows>
  static void axpy_rows(const float* const* p, const float* const* v, int64_t n_keys, float* const* y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) axpy_keys_block<kRows, 2>(p, v, n_keys, y, i);
    for (; i + 8 <= n; i += 8) axpy_keys_block<kRows, 1>(p, v, n_keys, y, i);
    for (int r = 0; r < kRows && i < n; ++r)  // the tail as axpy's, key by key
      for (int64_t j = 0; j < n_keys; ++j)
        for (int64_t t = i; t < n; ++t) y[r][t] += p[r][j] * v[j][t];
  }
};
using RowOps = AttentionRowOps<KeyKernels>;

void scale(float a, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= a;
}

template <bool kBf16>
void dequantize_half_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 v = kBf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(dst + i, v);
  }
  if (i < n) dequantize_kv_row_scalar(kBf16 ? KVType::BF16 : KVType::F16, reinterpret_cast<const uint8_t*>(src + i), dst + i, n - i);
}

void dequantize_q8_0_row(const uint8_t* src, float* dst, int64_t n) {
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m256 d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(blocks[b].d))));
    for (int k = 0; k < 4; ++k) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blocks[b].qs + 8 * k));
      _mm256_storeu_ps(dst + b * kQK8_0 + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}

void dequantize(KVType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case KVType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case KVType::F16: return dequantize_half_row<false>(reinterpret_cast<const uint16_t*>(src), dst, n);
    case KVType::BF16: return dequantize_half_row<true>(reinterpret_cast<const uint16_t*>(src), dst, n);
    case KVType::Q8_0: return dequantize_q8_0_row(src, dst, n);
    default: break;
  }
  dequantize_kv_row_scalar(type, src, dst, n);
}

}  // namespace

const AttentionVectorOps& avx2_attention_vector_ops() {
  static const AttentionVectorOps ops{RowOps::dot, RowOps::axpy, scale, dequantize, RowOps::dot_keys,
                                      RowOps::axpy_keys};
  return ops;
}

}  // namespace kvserve
