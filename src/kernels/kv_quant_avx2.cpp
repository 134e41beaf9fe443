// AVX2 versions of the attention inner-loop ops and of the f16 / bf16 / q8_0
// KV row dequantizers (fp8 and q4_0 stay scalar). Without them an AVX2-only
// CPU ran attention's dot products and accumulations in scalar code: a
// quarter of a 256-token SmolLM2 prefill on a Zen 1 core.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/fast_exp.h"
#include "kernels/key_lanes.h"
#include "kernels/kv_quant.h"

namespace kvserve {
namespace {

float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// horizontal_sum's first step for two keys at once: [x_l + x_{l+4} | y_l + y_{l+4}], l < 4.
__m256 fold_pair(__m256 x, __m256 y) {
  return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
}

// The rest of horizontal_sum's tree for 8 keys: pairs[p] = fold_pair of keys
// 2p and 2p + 1; lane j of the result is key j's sum. Each addition is one of
// horizontal_sum's (the same two operands), so the bits are its bits.
__m256 reduce_8_keys(const __m256* pairs) {
  __m256 twos[2];  // 128-bit half i: keys 4t + i and 4t + 2 + i, their lanes (0 + 2) and (1 + 3)
  for (int t = 0; t < 2; ++t) {
    const __m256 a = pairs[2 * t], b = pairs[2 * t + 1];
    twos[t] = _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // half i, lane m: key i + 2m.
  const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(twos[0], twos[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(twos[0], twos[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// K/V elements loaded 8 at a time as floats: f32 as stored, f16 and bf16
// widened as they load (exactly: the same floats their dequantization gives).
struct F32Elems {
  using T = float;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static float at(const float* p, int64_t i) { return p[i]; }
};
struct F16Elems {
  using T = uint16_t;
  static constexpr KVType kType = KVType::F16;
  static __m256 load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float at(const uint16_t* p, int64_t i) { return fp16_to_f32(p[i]); }
};
struct BF16Elems {
  using T = uint16_t;
  static constexpr KVType kType = KVType::BF16;
  static __m256 load(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float at(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
};

// y[r][i .. i + 8 kChunks) += p[r][j] v[j][..] over the keys in order, for
// kRows rows at once (each v chunk loaded once, the rows' y in registers):
// the same multiply-adds per element as axpy.
template <class E, int kRows, int kChunks>
void axpy_keys_block(const float* const* p, const typename E::T* const* v, int64_t n_keys, float* const* y, int64_t i) {
  __m256 acc[kRows][kChunks];
  #pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) acc[r][c] = _mm256_loadu_ps(y[r] + i + 8 * c);
  for (int64_t j = 0; j < n_keys; ++j) {
    __m256 x[kChunks];
    #pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) x[c] = E::load(v[j] + i + 8 * c);
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

// The row kernels for kRows query rows at once over keys of element type E,
// from which AttentionRowOps (kv_quant.h) makes the table's dot, axpy,
// dot_keys and axpy_keys (f32), and the f16 / bf16 ones axpy_keys_half.
template <class E>
struct KeyKernels {
  using T = typename E::T;
  // The 8 lanes of key kj's dot with each of kRows rows over its first
  // n / 8 * 8 elements, before the reduction: two 8-wide chains, an odd
  // 8-element chunk into the first, added.
  template <int kRows>
  static void lane_sums(const float* const* q, const T* kj, int64_t n, __m256* sums) {
    __m256 acc0[kRows], acc1[kRows];
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 k0 = E::load(kj + i), k1 = E::load(kj + i + 8);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), k0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i + 8), k1, acc1[r]);
      }
    }
    if (i + 8 <= n) {
      const __m256 k0 = E::load(kj + i);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), k0, acc0[r]);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) sums[r] = _mm256_add_ps(acc0[r], acc1[r]);
  }

  // dot(q[r], k[j], n) for kRows rows at once, each key chunk loaded once for
  // the rows. A fixed summation order for a given n: lane_sums, the
  // horizontal_sum tree (eight keys at a time by reduce_8_keys: the same
  // additions), then the n % 8 tail in order.
  template <int kRows>
  static void dot_rows(const float* const* q, const T* const* k, int64_t n_keys, int64_t n, float* const* out) {
    int64_t j = 0;
    for (; j + 8 <= n_keys; j += 8) {
      __m256 pairs[kRows][4];
      for (int p = 0; p < 4; ++p) {
        __m256 x[kRows], y[kRows];
        lane_sums<kRows>(q, k[j + 2 * p], n, x);
        lane_sums<kRows>(q, k[j + 2 * p + 1], n, y);
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) pairs[r][p] = fold_pair(x[r], y[r]);
      }
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) _mm256_storeu_ps(out[r] + j, reduce_8_keys(pairs[r]));
    }
    for (; j < n_keys; ++j) {
      __m256 sums[kRows];
      lane_sums<kRows>(q, k[j], n, sums);
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) out[r][j] = horizontal_sum(sums[r]);
    }
    if (n % 8 != 0)  // the tail, in order, after each key's sum
      for (int r = 0; r < kRows; ++r)
        for (int64_t jj = 0; jj < n_keys; ++jj)
          for (int64_t t = n / 8 * 8; t < n; ++t) out[r][jj] += q[r][t] * E::at(k[jj], t);
  }

  // y[r] += p[r][j] v[j] for every key in order, kRows rows at once.
  template <int kRows>
  static void axpy_rows(const float* const* p, const T* const* v, int64_t n_keys, float* const* y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) axpy_keys_block<E, kRows, 2>(p, v, n_keys, y, i);
    for (; i + 8 <= n; i += 8) axpy_keys_block<E, kRows, 1>(p, v, n_keys, y, i);
    for (int r = 0; r < kRows && i < n; ++r)  // the tail as axpy's, key by key
      for (int64_t j = 0; j < n_keys; ++j)
        for (int64_t t = i; t < n; ++t) y[r][t] += p[r][j] * E::at(v[j], t);
  }
};
using RowOps = AttentionRowOps<KeyKernels<F32Elems>>;

using HalfRowOps = HalfAttentionRowOps<KeyKernels<F16Elems>, KeyKernels<BF16Elems>>;

// Scores of keys in lanes (key_lanes.h) for kRows rows, one group of 16 keys
// (two registers) at a time: one fused multiply-add per dimension in order,
// scalar_dot_lanes' bits, each dimension widened once for every row.
template <class E>
struct LaneKernels {
  using T = typename E::T;
  template <int kRows>
  static void dot_rows(const float* const* q, const T* const* groups, int64_t n_groups, int64_t n, float* const* out) {
    for (int64_t g = 0; g < n_groups; ++g) {
      __m256 acc[kRows][2];
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      const T* k = groups[g];
      for (int64_t d = 0; d < n; ++d) {
        const __m256 k0 = E::load(k + d * kKeyLanes), k1 = E::load(k + d * kKeyLanes + 8);
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) {
          const __m256 qd = _mm256_set1_ps(q[r][d]);
          acc[r][0] = _mm256_fmadd_ps(qd, k0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(qd, k1, acc[r][1]);
        }
      }
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        _mm256_storeu_ps(out[r] + g * kKeyLanes, acc[r][0]);
        _mm256_storeu_ps(out[r] + g * kKeyLanes + 8, acc[r][1]);
      }
    }
  }
};
using LaneOps = LaneAttentionRowOps<LaneKernels<F32Elems>, LaneKernels<F16Elems>, LaneKernels<BF16Elems>>;

// Scores of q8_0 keys in lanes (key_lanes.h) for kRows quantized query rows,
// one group of 16 keys (two registers of 8 keys x 4 elements) at a time, per
// block the query's high then (QueryQ8::parts == 2) low part. Without VNNI the
// unsigned key bytes k + 128 would saturate vpmaddubsw's pair sums, so the
// keys go back to signed (xor 0x80) and take the row's signs (vpsignb), and
// vpmaddubsw multiplies them by |q|: pair sums stay within 2 * 127 * 127. The integer dots are
// exact, and their fold is scalar_dot_lanes_q8's, so the bits are the reference's.
template <int kRows>
void q8_lane_rows(const QueryQ8* q, const uint8_t* const* groups, int64_t n_groups, int64_t n, float* const* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  const int64_t n_blocks = n / kQK8_0;
  for (int64_t g = 0; g < n_groups; ++g) {
    __m256 acc[kRows][2];
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* block = groups[g] + b * kQ8LaneBlockBytes;
      const __m256 dk0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
      const __m256 dk1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
      for (int part = 0; part < q[0].parts; ++part) {
        __m256i dot[kRows][2];
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
        for (int u = 0; u < kQK8_0 / 4; ++u) {
          const uint8_t* quad = block + kQ8LaneScaleBytes + u * 64;
          const __m256i k0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad)), flip);
          const __m256i k1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad + 32)), flip);
          #pragma GCC unroll 16
          for (int r = 0; r < kRows; ++r) {
            int32_t bytes;
            std::memcpy(&bytes, q[r].q + part * n + b * kQK8_0 + u * 4, 4);
            const __m256i qd = _mm256_set1_epi32(bytes), qa = _mm256_abs_epi8(qd);
            dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k0, qd)), ones));
            dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(k1, qd)), ones));
          }
        }
        #pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) {
          const __m256 dq = _mm256_set1_ps(part == 0 ? q[r].d[b] : q[r].d[b] * kQueryLowStep);
          acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][0]), _mm256_mul_ps(dk0, dq), acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][1]), _mm256_mul_ps(dk1, dq), acc[r][1]);
        }
      }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      _mm256_storeu_ps(out[r] + g * kKeyLanes, acc[r][0]);
      _mm256_storeu_ps(out[r] + g * kKeyLanes + 8, acc[r][1]);
    }
  }
}

void dot_lanes_q8(const QueryQ8* q, int n_rows, const uint8_t* const* groups, int64_t n_groups, int64_t n,
                  float* const* out) {
  with_attention_rows(n_rows, [&](auto rows) { q8_lane_rows<decltype(rows)::value>(q, groups, n_groups, n, out); });
}

// fast_exp::exp_scalar on 8 lanes: the same operations in the same order.
__m256 exp_lanes(__m256 x) {
  using namespace fast_exp;
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPoly[i]));
  const __m256 e_r = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 out = _mm256_mul_ps(e_r, _mm256_castsi256_ps(bits));
  out = _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(kMinInput), _CMP_LT_OQ));
  return _mm256_blendv_ps(out, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                          _mm256_cmp_ps(x, _mm256_set1_ps(kMaxInput), _CMP_GT_OQ));
}

float scale_max(float* x, int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), s);
    _mm256_storeu_ps(x + j, v);
    m = _mm256_max_ps(m, v);
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float max = std::max(_mm_cvtss_f32(h), _mm_cvtss_f32(_mm_movehdup_ps(h)));
  return fast_exp::scale_max_scalar(x + j, n - j, scale, max);
}

float exp_sum(float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_lanes(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    _mm256_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  const float sum = horizontal_sum(acc);
  return fast_exp::exp_sum_scalar(x + j, n - j, shift, sum);
}

void scale(float a, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= a;
}

template <class E>
void dequantize_half_row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, E::load(src + i));
  if (i < n) dequantize_kv_row_scalar(E::kType, reinterpret_cast<const uint8_t*>(src + i), dst + i, n - i);
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
    case KVType::F16: return dequantize_half_row<F16Elems>(reinterpret_cast<const uint16_t*>(src), dst, n);
    case KVType::BF16: return dequantize_half_row<BF16Elems>(reinterpret_cast<const uint16_t*>(src), dst, n);
    case KVType::Q8_0: return dequantize_q8_0_row(src, dst, n);
    default: break;
  }
  dequantize_kv_row_scalar(type, src, dst, n);
}

}  // namespace

const AttentionVectorOps& avx2_attention_vector_ops() {
  static const AttentionVectorOps ops{RowOps::dot,       RowOps::axpy,      scale,     dequantize,
                                      RowOps::dot_keys,  RowOps::axpy_keys, scale_max, exp_sum,
                                      HalfRowOps::axpy_keys_half,    LaneOps::dot_lanes,
                                      LaneOps::dot_lanes_half,       dot_lanes_q8};
  return ops;
}

}  // namespace kvserve
