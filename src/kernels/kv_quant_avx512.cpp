// AVX-512 versions of the attention inner-loop ops and of the KV row
// dequantizers (q4_0 stays scalar: it is the stretch type, not a fast path).
// Same warning workaround for GCC 12's AVX-512 headers as matmul_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "kernels/fast_exp.h"
#include "kernels/key_lanes.h"
#include "kernels/kv_quant.h"

namespace kvserve {
namespace {

__mmask16 tail_mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// The sum of v's 16 lanes by a fixed tree: lanes l + 8, then l + 4, then
// l + 2, then l + 1 (the tree of GCC's and clang's _mm512_reduce_add_ps).
float reduce_add(__m512 v) {
  const __m256 t3 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 t6 = _mm_add_ps(_mm256_castps256_ps128(t3), _mm256_extractf128_ps(t3, 1));
  const __m128 t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_movehdup_ps(t8));
}

// reduce_add's first step for two keys at once: [x_l + x_{l+8} | y_l + y_{l+8}], l < 8.
__m512 fold_pair(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}

// The rest of reduce_add's tree for 16 keys: pairs[p] = fold_pair of keys 2p
// and 2p + 1; lane j of the result is key j's sum. Each addition is one of
// reduce_add's (the same two operands), so the bits are reduce_add's.
[[gnu::always_inline]] inline __m512 reduce_16_keys(const __m512* pairs) {
  __m512 fours[4];  // 128-bit quarter i: key 4f + i's lanes l + (l + 4), l < 4
  for (int f = 0; f < 4; ++f) {
    const __m512 a = pairs[2 * f], b = pairs[2 * f + 1];
    fours[f] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  __m512 twos[2];  // quarter i: keys 8t + i and 8t + 4 + i, their lanes (0 + 2) and (1 + 3)
  for (int t = 0; t < 2; ++t) {
    const __m512 a = fours[2 * t], b = fours[2 * t + 1];
    twos[t] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // quarter i, lane m: key i + 4m.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(twos[0], twos[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(twos[0], twos[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i key_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(key_order, sums);
}

// K/V elements loaded 16 at a time as floats (masked lanes read as 0): f32 as
// stored, f16 and bf16 widened as they load (exactly: the same floats their
// dequantization gives, so the _half ops give the f32 ops' bits).
// load16: all 16 lanes, unmasked.
// load_at(row, i, m): elements i .. i + 16 of a row, as load(row + i, m).
struct F32Elems {
  using T = float;
  static __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 load_at(const float* row, int64_t i, __mmask16 m) { return load(row + i, m); }
};
struct F16Elems {
  using T = uint16_t;
  static __m512 load(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
  static __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_at(const uint16_t* row, int64_t i, __mmask16 m) { return load(row + i, m); }
};
struct BF16Elems {
  using T = uint16_t;
  static __m512 load(const uint16_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
  static __m512 load16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load_at(const uint16_t* row, int64_t i, __mmask16 m) { return load(row + i, m); }
};

float half_scale(uint16_t d) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d))); }

// q8_0 rows (BlockQ8_0s) widened as they load, the way dequantize_q8_0_row
// does it (scale times value, one multiply): axpy rows only (i a multiple of 16).
struct Q8Elems {
  using T = uint8_t;
  static __m512 load_at(const uint8_t* row, int64_t i, __mmask16 m) {
    const BlockQ8_0& block = reinterpret_cast<const BlockQ8_0*>(row)[i / kQK8_0];
    const __m128i q = _mm_maskz_loadu_epi8(m, block.qs + i % kQK8_0);
    return _mm512_mul_ps(_mm512_set1_ps(half_scale(block.d)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
  }
};

// y[r][i .. i + 16 kChunks) += p[r][j] v[j][..] over the keys in order, for
// kRows rows at once: each v chunk loaded once, kRows x kChunks registers of
// y held across the keys. The same multiply-adds per element as axpy; `tail`
// masks the last chunk (all lanes but at the row's end).
template <class E, int kRows, int kChunks>
void axpy_keys_block(const float* const* p, const typename E::T* const* v, int64_t n_keys, float* const* y, int64_t i,
                     __mmask16 tail) {
  const auto mask = [tail](int c) { return c == kChunks - 1 ? tail : __mmask16(0xffff); };
  __m512 acc[kRows][kChunks];
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm512_maskz_loadu_ps(mask(c), y[r] + i + 16 * c);
  for (int64_t j = 0; j < n_keys; ++j) {
    __m512 x[kChunks];
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) x[c] = E::load_at(v[j], i + 16 * c, mask(c));
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r][j]);
      #pragma GCC unroll 16
      for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm512_fmadd_ps(pr, x[c], acc[r][c]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) _mm512_mask_storeu_ps(y[r] + i + 16 * c, mask(c), acc[r][c]);
}

// The row kernels for kRows query rows at once over keys of element type E,
// from which AttentionRowOps (kv_quant.h) makes the table's dot, axpy,
// dot_keys and axpy_keys (f32), and the f16 / bf16 ones axpy_keys_half.
template <class E>
struct KeyKernels {
  using T = typename E::T;
  // The 16 lanes of the dot of each of kKeys keys with each of kRows rows,
  // before the reduction: two 16-wide chains, the masked tail into the first,
  // added. Each query chunk is loaded once for the keys, each key chunk once
  // for the rows; every (row, key) has its own chains, so the bits are those
  // of one row and one key alone.
  template <int kRows, int kKeys>
  static void lane_sums(const float* const* q, const T* const* k, int64_t n, __m512 (*sums)[kKeys]) {
    __m512 acc0[kRows][kKeys], acc1[kRows][kKeys];
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < kKeys; ++c) acc0[r][c] = acc1[r][c] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      __m512 k0[kKeys], k1[kKeys];
      #pragma GCC unroll 16
      for (int c = 0; c < kKeys; ++c) k0[c] = E::load(k[c] + i, 0xffff), k1[c] = E::load(k[c] + i + 16, 0xffff);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        const __m512 q0 = _mm512_loadu_ps(q[r] + i), q1 = _mm512_loadu_ps(q[r] + i + 16);
        #pragma GCC unroll 16
        for (int c = 0; c < kKeys; ++c) {
          acc0[r][c] = _mm512_fmadd_ps(q0, k0[c], acc0[r][c]);
          acc1[r][c] = _mm512_fmadd_ps(q1, k1[c], acc1[r][c]);
        }
      }
    }
    for (; i < n; i += 16) {
      const __mmask16 m = tail_mask(n - i < 16 ? n - i : 16);
      __m512 k0[kKeys];
      #pragma GCC unroll 16
      for (int c = 0; c < kKeys; ++c) k0[c] = E::load(k[c] + i, m);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        const __m512 q0 = _mm512_maskz_loadu_ps(m, q[r] + i);
        #pragma GCC unroll 16
        for (int c = 0; c < kKeys; ++c) acc0[r][c] = _mm512_fmadd_ps(q0, k0[c], acc0[r][c]);
      }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
      #pragma GCC unroll 16
      for (int c = 0; c < kKeys; ++c) sums[r][c] = _mm512_add_ps(acc0[r][c], acc1[r][c]);
  }

  // dot(q[r], k[j], n) for kRows rows at once, each key chunk loaded once for
  // the rows. Sixteen keys at a time reduce together (reduce_16_keys), a lone
  // key by reduce_add: the same tree, so the same bits for every key.
  template <int kRows>
  static void dot_rows(const float* const* q, const T* const* k, int64_t n_keys, int64_t n, float* const* out) {
    int64_t j = 0;
    for (; j + 16 <= n_keys; j += 16) {
      __m512 pairs[kRows][8];
      for (int p = 0; p < 8; ++p) {
        __m512 xy[kRows][2];
        lane_sums<kRows, 2>(q, k + j + 2 * p, n, xy);
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) pairs[r][p] = fold_pair(xy[r][0], xy[r][1]);
      }
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(out[r] + j, reduce_16_keys(pairs[r]));
    }
    for (; j < n_keys; ++j) {
      __m512 sums[kRows][1];
      lane_sums<kRows, 1>(q, k + j, n, sums);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) out[r][j] = reduce_add(sums[r][0]);
    }
  }

  // y[r] += p[r][j] v[j] for every key in order, kRows rows at once.
  template <int kRows>
  static void axpy_rows(const float* const* p, const T* const* v, int64_t n_keys, float* const* y, int64_t n) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) axpy_keys_block<E, kRows, 4>(p, v, n_keys, y, i, 0xffff);
    for (; i + 16 <= n; i += 16) axpy_keys_block<E, kRows, 1>(p, v, n_keys, y, i, 0xffff);
    if (i < n) axpy_keys_block<E, kRows, 1>(p, v, n_keys, y, i, tail_mask(n - i));
  }
};
using RowOps = AttentionRowOps<KeyKernels<F32Elems>>;

using HalfRowOps = HalfAttentionRowOps<KeyKernels<F16Elems>, KeyKernels<BF16Elems>>;

// Scores of keys in lanes (key_lanes.h) for kRows rows over groups of element
// type E: one accumulator per row holding a group's 16 keys' scores, one fused
// multiply-add per dimension in order (scalar_dot_lanes' bits), each
// dimension loaded and widened once for every row. One group at a time, in
// address order: each group is its own 2 KB stream (f16, head size 64), and
// four read side by side (as this kernel did, for more independent chains)
// defeat the hardware prefetcher; from DRAM one stream is 15-35% faster at
// every row count, in cache 3-6% slower for one to three rows (fewer chains;
// docs/attention.md, "One group at a time"). Decode at depth streams.
template <class E>
struct LaneKernels {
  using T = typename E::T;
  template <int kRows>
  static void group(const float* const* q, const T* keys, int64_t n, float* const* out, int64_t at) {
    __m512 acc[kRows];
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t d = 0; d < n; ++d) {
      const __m512 k = E::load16(keys + d * kKeyLanes);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k, acc[r]);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(out[r] + at, acc[r]);
  }

  template <int kRows>
  static void dot_rows(const float* const* q, const T* const* groups, int64_t n_groups, int64_t n, float* const* out) {
    for (int64_t g = 0; g < n_groups; ++g) group<kRows>(q, groups[g], n, out, g * kKeyLanes);
  }
};
using LaneOps = LaneAttentionRowOps<LaneKernels<F32Elems>, LaneKernels<F16Elems>, LaneKernels<BF16Elems>>;

// AttentionVectorOps::axpy_keys_q8: axpy_keys' kernels over q8_0 rows.
void axpy_keys_q8(const float* const* p, int n_rows, const uint8_t* const* v, int64_t n_keys, float* const* y,
                  int64_t n) {
  with_attention_rows(n_rows, [&](auto rows) { KeyKernels<Q8Elems>::axpy_rows<decltype(rows)::value>(p, v, n_keys, y, n); });
}

// Scores of q8_0 keys in lanes (key_lanes.h) for kRows quantized query rows,
// one group at a time (in address order, as LaneKernels: from DRAM 30-70%
// faster than four groups side by side): per 32-element block and part of the
// query (its high and low 8 bits, or the high only: QueryQ8::parts), one
// vpdpbusd per quad of elements and row (the unsigned key bytes k + 128 times
// the row's signed quad, broadcast), then the exact integer dot (less 128 *
// the part's sum over the block) folded into the row's scores as
// scalar_dot_lanes_q8 does.
template <int kRows>
void q8_lane_group(const QueryQ8* q, const uint8_t* keys, int64_t n, float* const* out, int64_t at) {
  const int64_t n_blocks = n / kQK8_0;
  __m512 acc[kRows];
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* block = keys + b * kQ8LaneBlockBytes;
    const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    for (int part = 0; part < q[0].parts; ++part) {
      __m512i dot[kRows];
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) dot[r] = _mm512_setzero_si512();
      #pragma GCC unroll 8
      for (int u = 0; u < kQK8_0 / 4; ++u) {
        const __m512i k = _mm512_loadu_si512(block + kQ8LaneScaleBytes + u * 64);
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) {
          int32_t quad;
          std::memcpy(&quad, q[r].q + part * n + b * kQK8_0 + u * 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], k, _mm512_set1_epi32(quad));
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        const __m512i offset = _mm512_set1_epi32(128 * q[r].sum[part * n_blocks + b]);
        const __m512 dq = _mm512_set1_ps(part == 0 ? q[r].d[b] : q[r].d[b] * kQueryLowStep);
        const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r], offset));
        acc[r] = _mm512_fmadd_ps(exact, _mm512_mul_ps(dk, dq), acc[r]);
      }
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(out[r] + at, acc[r]);
}

// AttentionVectorOps::dot_lanes_q8.
void dot_lanes_q8(const QueryQ8* q, int n_rows, const uint8_t* const* groups, int64_t n_groups, int64_t n,
                  float* const* out) {
  with_attention_rows(n_rows, [&](auto rows) {
    for (int64_t g = 0; g < n_groups; ++g) q8_lane_group<decltype(rows)::value>(q, groups[g], n, out, g * kKeyLanes);
  });
}

void scale(float a, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// fast_exp::exp_scalar on 16 lanes: the same operations in the same order.
__m512 exp_lanes(__m512 x) {
  using namespace fast_exp;
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[i]));
  const __m512 e_r = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 out = _mm512_mul_ps(e_r, _mm512_castsi512_ps(bits));
  out = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kMinInput), _CMP_LT_OQ), out, _mm512_setzero_ps());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kMaxInput), _CMP_GT_OQ), out,
                              _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

float scale_max(float* x, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), s);
    _mm512_storeu_ps(x + j, v);
    m = _mm512_max_ps(m, v);
  }
  const float max = _mm512_reduce_max_ps(m);
  return fast_exp::scale_max_scalar(x + j, n - j, scale, max);
}

float exp_sum(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp_lanes(_mm512_sub_ps(_mm512_loadu_ps(x + j), s));
    _mm512_storeu_ps(x + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  const float sum = _mm512_reduce_add_ps(acc);
  return fast_exp::exp_sum_scalar(x + j, n - j, shift, sum);
}

template <class E>
void dequantize_half_row(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i < 16 ? n - i : 16);
    _mm512_mask_storeu_ps(dst + i, m, E::load(src + i, m));
  }
}

void dequantize_q8_0_row(const uint8_t* src, float* dst, int64_t n) {
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m512 d = _mm512_set1_ps(half_scale(blocks[b].d));
    for (int half = 0; half < 2; ++half) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].qs + half * 16));
      _mm512_storeu_ps(dst + b * kQK8_0 + half * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
    }
  }
}

// An e4m3 code's 7 magnitude bits, moved up by 7, are the f16 with the same
// mantissa and exponent field; f16's bias (15) is 8 more than e4m3's (7), so
// that f16 is the e4m3 value times 2^-8 (subnormals included). The one e4m3
// NaN pattern would read as a finite f16 and is patched separately.
void dequantize_fp8_row(const uint8_t* src, float* dst, int64_t n) {
  const auto* blocks = reinterpret_cast<const Fp8Block*>(src);
  const __m256i magnitude = _mm256_set1_epi16(0x7f), sign = _mm256_set1_epi16(0x80);
  const __m512 nan = _mm512_set1_ps(__builtin_nanf(""));
  for (int64_t b = 0; b < n / kFp8BlockElems; ++b) {
    const __m512 s = _mm512_set1_ps(__builtin_ldexpf(1.0f, blocks[b].scale_exp - 127 + 8));
    for (int half = 0; half < 2; ++half) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[b].q + half * 16));
      const __m256i c = _mm256_cvtepu8_epi16(q);
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(c, sign), 8),
                                        _mm256_slli_epi16(_mm256_and_si256(c, magnitude), 7));
      const __mmask16 is_nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(c, magnitude), magnitude);
      const __m512 v = _mm512_mask_mov_ps(_mm512_mul_ps(_mm512_cvtph_ps(h), s), is_nan, nan);
      _mm512_storeu_ps(dst + b * kFp8BlockElems + half * 16, v);
    }
  }
}

void dequantize(KVType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case KVType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case KVType::F16: return dequantize_half_row<F16Elems>(reinterpret_cast<const uint16_t*>(src), dst, n);
    case KVType::BF16: return dequantize_half_row<BF16Elems>(reinterpret_cast<const uint16_t*>(src), dst, n);
    case KVType::Q8_0: return dequantize_q8_0_row(src, dst, n);
    case KVType::FP8: return dequantize_fp8_row(src, dst, n);
    case KVType::Q4_0: break;
  }
  dequantize_kv_row_scalar(type, src, dst, n);
}

}  // namespace

const AttentionVectorOps& avx512_attention_vector_ops() {
  static const AttentionVectorOps ops{RowOps::dot,       RowOps::axpy,      scale,     dequantize,
                                      RowOps::dot_keys,  RowOps::axpy_keys, scale_max, exp_sum,
                                      HalfRowOps::axpy_keys_half,    LaneOps::dot_lanes,
                                      LaneOps::dot_lanes_half,       dot_lanes_q8,
                                      axpy_keys_q8};
  return ops;
}

}  // namespace kvserve
