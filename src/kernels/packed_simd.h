#pragma once
// Internal: the packed 8-bit-activation kernels (kernels/repack.h) as
// templates, instantiated by matmul_packed_avx2.cpp and _avx512.cpp with their
// own instruction sets (hence every function is static).
//
// One call computes 8 rows (one packed group) x N tokens. Each 32-bit lane is
// one row: a chunk register (4 values of 8 rows) meets a token's 4 activation
// bytes broadcast to all lanes in maddubs (u8 weights x s8 activations -> s16
// pairs), the s16 sums of a few chunks are folded into s32 by madd with the
// rows' integer scales (1 for the 32-value types), and each super-block ends
// with the float multiply-adds of repack.h's reference, in the same order.
// Bounds that keep the s16 sums exact: a pair is at most 2 x 15 x 127 (4-bit),
// 2 x 31 x 127 (5-bit), 2 x 63 x 127 (6-bit), 2 x 128 x 127 (Q8_0, signs moved
// onto the activations), 2 x 127 x 127 (IQ4 levels, likewise), so 8, 4, 2, 1
// and 1 chunks fit under 32767.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/packed_kernels.h"
#include "kernels/repack.h"

namespace kvserve {
namespace packed_simd {

template <typename F, int... I>
static inline void unroll_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
// f(0), f(1), ..., f(N - 1) with compile-time indices.
template <int N, typename F>
static inline void unroll(F&& f) {
  unroll_impl(f, std::make_integer_sequence<int, N>{});
}

static inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline __m128i load64(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
static inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}
static inline __m256 load_f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// Lane r = (s_r, s_r) as two s16, from 8 unsigned / signed bytes s_0..s_7.
static inline __m256i scale_pairs_u8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepu8_epi32(load64(p));
  return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}
static inline __m256i scale_pairs_i8(const uint8_t* p) {
  const __m256i v = _mm256_cvtepi8_epi32(load64(p));
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16));
}
// Lane r = (a_r, b_r) as two s16.
static inline __m256i pairs_u8(const uint8_t* a, const uint8_t* b) {
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(load64(a), load64(b)));
}
static inline __m256i pairs_i8(const uint8_t* a, const uint8_t* b) {
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(load64(a), load64(b)));
}
// Bit kBit of every byte moved to bit 4 (the Q5 fifth bits).
template <int kBit>
static inline __m256i fifth_bit(__m256i h) {
  __m256i v = h;
  if constexpr (kBit < 4) v = _mm256_slli_epi16(h, 4 - kBit);
  if constexpr (kBit > 4) v = _mm256_srli_epi16(h, kBit - 4);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}
// Bits 2k, 2k + 1 of every byte moved to bits 4, 5 (the Q6_K top bits).
template <int kPair>
static inline __m256i top_bits(__m256i h) {
  __m256i v = h;
  if constexpr (kPair < 2) v = _mm256_slli_epi16(h, 4 - 2 * kPair);
  if constexpr (kPair > 2) v = _mm256_srli_epi16(h, 2 * kPair - 4);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x30));
}

// Bit kBit of every byte moved to bit 2 (the Q3_K high bits).
template <int kBit>
static inline __m256i third_bit(__m256i h) {
  __m256i v = h;
  if constexpr (kBit < 2) v = _mm256_slli_epi16(h, 2 - kBit);
  if constexpr (kBit > 2) v = _mm256_srli_epi16(h, kBit - 2);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x04));
}
// Lane r = (s_r, s_r) as two s16 from the low nibbles of 8 bytes (Q2_K scales).
static inline __m256i scale_pairs_low4(const uint8_t* p) {
  const __m256i v = _mm256_and_si256(_mm256_cvtepu8_epi32(load64(p)), _mm256_set1_epi32(15));
  return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}
// Lane r = (a_r >> 4, b_r >> 4) as two s16 (Q2_K mins).
static inline __m256i pairs_high4(const uint8_t* a, const uint8_t* b) {
  const __m128i low4 = _mm_set1_epi8(15);
  const __m128i ha = _mm_and_si128(_mm_srli_epi16(load64(a), 4), low4), hb = _mm_and_si128(_mm_srli_epi16(load64(b), 4), low4);
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(ha, hb));
}

// Pins v to a register at this point. GCC otherwise computes all of a
// sub-block's maddubs first and sums them later, spilling the products (16
// registers); this keeps each token's s16 sum a running chain.
static inline void pin(__m256i& v) { __asm__("" : "+x"(v)); }

constexpr bool is_kquant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
// Q2_K / Q3_K: 2-bit planes (and Q3_K's third bit).
constexpr bool is_two_bit(DType t) { return t == DType::Q2_K || t == DType::Q3_K; }
// Types of 256-value super-blocks (PackedAct256 activations).
constexpr bool is_256(DType t) { return is_kquant(t) || t == DType::IQ4_XS || is_two_bit(t); }
constexpr bool has_fifth_bit(DType t) { return t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q5_K; }
// IQ4 types: 4-bit indices into kIQ4NLValues, looked up per chunk.
constexpr bool has_levels(DType t) { return t == DType::IQ4_NL || t == DType::IQ4_XS; }
// Types with an fp16 m[8] after d[8] in the header (w = d q + m).
constexpr bool has_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }

template <DType T>
struct Layout {
  static constexpr int kValues = is_256(T) ? 256 : 32;
  static constexpr size_t kHeader = has_min(T) ? 32 : (T == DType::Q4_K || T == DType::Q5_K) ? 160
                                    : (T == DType::Q6_K || T == DType::Q3_K) ? 144 : T == DType::IQ4_XS ? 80
                                    : T == DType::Q2_K ? 160 : 16;
  static constexpr size_t kSubBytes = T == DType::Q8_0 ? 256 : has_fifth_bit(T) ? 160 : T == DType::Q6_K ? 192
                                      : T == DType::Q3_K ? 96 : T == DType::Q2_K ? 64 : 128;
  static constexpr size_t kBytes = kHeader + kValues / 32 * kSubBytes;
};

// Adds chunk p's two weight registers (chunks 2p, 2p + 1 of sub-block q) times
// each token's activations x[t] (that sub-block's 32 bytes) into acc16[t].
template <DType T, int N, int kP>
static inline void chunk_pair(const uint8_t* q, const int8_t* const (&x)[N], __m256i (&acc16)[N]) {
  const __m256i nibbles = _mm256_set1_epi8(0x0f);
  const __m256i packed = load256(q + 32 * kP);
  __m256i lo = _mm256_and_si256(packed, nibbles);
  __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibbles);
  if constexpr (has_fifth_bit(T)) {
    const __m256i h = load256(q + 128);
    lo = _mm256_or_si256(lo, fifth_bit<2 * kP>(h));
    hi = _mm256_or_si256(hi, fifth_bit<2 * kP + 1>(h));
  }
  if constexpr (T == DType::Q6_K) {
    const __m256i h = load256(q + 128 + 32 * (kP / 2));
    lo = _mm256_or_si256(lo, top_bits<(2 * kP) % 4>(h));
    hi = _mm256_or_si256(hi, top_bits<(2 * kP + 1) % 4>(h));
  }
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    acc16[t] = _mm256_add_epi16(acc16[t], _mm256_maddubs_epi16(lo, broadcast4(x[t] + 8 * kP)));
    acc16[t] = _mm256_add_epi16(acc16[t], _mm256_maddubs_epi16(hi, broadcast4(x[t] + 8 * kP + 4)));
    if constexpr (N > 1) pin(acc16[t]);  // one token: 16 registers suffice, let GCC schedule
  }
}

// acc32[t] += madd(acc16[t], scale); acc16[t] = 0.
template <int N>
static inline void fold(__m256i (&acc16)[N], __m256i scale, __m256i (&acc32)[N]) {
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    acc32[t] = _mm256_add_epi32(acc32[t], _mm256_madd_epi16(acc16[t], scale));
    acc16[t] = _mm256_setzero_si256();
  }
}

// One chunk of signed weights w (IQ4 levels, |w| <= 127) times each token's
// 4 activation bytes at x[t] + 4c, signs moved onto the activations,
// scaled by `scale` into acc32[t] (one chunk per fold, as for Q8_0).
template <int N>
static inline void signed_chunk(__m256i w, const int8_t* const (&x)[N], int c, __m256i scale, __m256i (&acc32)[N]) {
  const __m256i w_abs = _mm256_abs_epi8(w);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    const __m256i xs = _mm256_sign_epi8(broadcast4(x[t] + 4 * c), w);
    acc32[t] = _mm256_add_epi32(acc32[t], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, xs), scale));
  }
}

// IQ4 sub-block: each 4-bit plane register's nibbles (chunks 2p, 2p + 1)
// looked up in kIQ4NLValues.
template <int N>
static inline void level_dots(const uint8_t* q, const int8_t* const (&x)[N], __m256i scale, __m256i (&acc32)[N]) {
  const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
  const __m256i nibbles = _mm256_set1_epi8(0x0f);
  unroll<4>([&](auto p) {
    const __m256i packed = load256(q + 32 * p);
    signed_chunk(_mm256_shuffle_epi8(levels, _mm256_and_si256(packed, nibbles)), x, 2 * p, scale, acc32);
    signed_chunk(_mm256_shuffle_epi8(levels, _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibbles)), x, 2 * p + 1,
                 scale, acc32);
  });
}

// Q2_K / Q3_K sub-block: 2-bit plane register p holds chunks 4p + s in bits
// 2s, 2s + 1 (Q3_K: bit c of the high plane's bytes is chunk c's third bit,
// unsigned q + 4 in 0..7). Chunks 0..3 are one 16-value group (scale), 4..7
// the next (scale_hi); pairs <= 2 x 7 x 127, four of them fit s16.
template <DType T, int N>
static inline void two_bit_dots(const uint8_t* q, const int8_t* const (&x)[N], __m256i scale, __m256i scale_hi,
                                __m256i (&acc32)[N]) {
  __m256i acc16[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc16[t] = _mm256_setzero_si256();
  unroll<2>([&](auto p) {
    const __m256i packed = load256(q + 32 * p);
    unroll<4>([&](auto s) {
      constexpr int c = 4 * decltype(p)::value + decltype(s)::value;
      __m256i w = _mm256_and_si256(_mm256_srli_epi16(packed, 2 * decltype(s)::value), _mm256_set1_epi8(3));
      if constexpr (T == DType::Q3_K) w = _mm256_or_si256(w, third_bit<c>(load256(q + 64)));
      #pragma GCC unroll 16
      for (int t = 0; t < N; ++t) {
        acc16[t] = _mm256_add_epi16(acc16[t], _mm256_maddubs_epi16(w, broadcast4(x[t] + 4 * c)));
        if constexpr (N > 1) pin(acc16[t]);
      }
    });
    fold(acc16, decltype(p)::value == 0 ? scale : scale_hi, acc32);
  });
}

// The integer dots of one 32-value sub-block (the whole block for the
// 32-value types), scaled by `scale` (Q6_K: scale_hi for chunks 4..7).
template <DType T, int N>
static inline void sub_block_dots(const uint8_t* q, const int8_t* const (&x)[N], __m256i scale, __m256i scale_hi,
                                  __m256i (&acc32)[N]) {
  if constexpr (T == DType::Q8_0) {
    unroll<8>([&](auto c) {
      const __m256i w = load256(q + 32 * c);
      const __m256i w_abs = _mm256_abs_epi8(w);
      #pragma GCC unroll 16
      for (int t = 0; t < N; ++t) {
        const __m256i xs = _mm256_sign_epi8(broadcast4(x[t] + 4 * c), w);
        acc32[t] = _mm256_add_epi32(acc32[t], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, xs), scale));
      }
    });
    return;
  }
  if constexpr (has_levels(T)) {
    level_dots(q, x, scale, acc32);
    return;
  }
  if constexpr (is_two_bit(T)) {
    two_bit_dots<T, N>(q, x, scale, scale_hi, acc32);
    return;
  }
  __m256i acc16[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc16[t] = _mm256_setzero_si256();
  unroll<4>([&](auto p) {
    chunk_pair<T, N, p>(q, x, acc16);
    if constexpr (T == DType::Q6_K) fold(acc16, p < 2 ? scale : scale_hi, acc32);
    else if constexpr (has_fifth_bit(T)) { if constexpr (p % 2 == 1) fold(acc16, scale, acc32); }
    else if constexpr (p == 3) fold(acc16, scale, acc32);
  });
}

// One 32-value super-block of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL for N tokens.
template <DType T, int N>
static inline void block32(const uint8_t* sb, const int8_t* const (&x)[N], const PackedAct32* const (&a)[N],
                           __m256 (&acc)[N]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) isum[t] = _mm256_setzero_si256();
  sub_block_dots<T, N>(sb + Layout<T>::kHeader, x, ones, ones, isum);
  const __m256 d = load_f16x8(sb);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    if constexpr (T == DType::Q4_0) isum[t] = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(8 * a[t]->sum));
    if constexpr (T == DType::Q5_0) isum[t] = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(16 * a[t]->sum));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, _mm256_set1_ps(a[t]->d)), acc[t]);
    if constexpr (has_min(T)) acc[t] = _mm256_fmadd_ps(load_f16x8(sb + 16), _mm256_set1_ps(a[t]->s), acc[t]);
  }
}

// One 256-value super-block of Q2_K..Q6_K / IQ4_XS for N tokens; x[t] points
// at the super-block's activations.
template <DType T, int N>
static inline void block256(const uint8_t* sb, const int8_t* const (&x)[N], const PackedAct256* const (&a)[N],
                            __m256 (&acc)[N]) {
  using L = Layout<T>;
  __m256i dots[N], bias[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) dots[t] = bias[t] = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const int8_t* xj[N];
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) xj[t] = x[t] + 32 * j;
    const uint8_t* q = sb + L::kHeader + static_cast<size_t>(j) * L::kSubBytes;
    if constexpr (T == DType::Q6_K || T == DType::Q3_K) {
      sub_block_dots<T, N>(q, xj, scale_pairs_i8(sb + 16 + 16 * j), scale_pairs_i8(sb + 24 + 16 * j), dots);
    } else if constexpr (T == DType::Q2_K) {
      sub_block_dots<T, N>(q, xj, scale_pairs_low4(sb + 32 + 16 * j), scale_pairs_low4(sb + 40 + 16 * j), dots);
    } else if constexpr (T == DType::IQ4_XS) {
      const __m256i scale = scale_pairs_i8(sb + 16 + 8 * j);
      sub_block_dots<T, N>(q, xj, scale, scale, dots);
    } else {
      const __m256i scale = scale_pairs_u8(sb + 32 + 8 * j);
      sub_block_dots<T, N>(q, xj, scale, scale, dots);
    }
  }
  const __m256 d = load_f16x8(sb);
  if constexpr (T == DType::IQ4_XS) {
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[t]), _mm256_mul_ps(d, _mm256_set1_ps(a[t]->d)), acc[t]);
  } else if constexpr (T == DType::Q6_K || T == DType::Q3_K) {  // w = d scale_g (q - 32), d scale_g (q - 4)
    #pragma GCC unroll 16
    for (int k = 0; k < 8; ++k) {
      const __m256i pair = pairs_i8(sb + 16 + 16 * k, sb + 24 + 16 * k);
      #pragma GCC unroll 16
      for (int t = 0; t < N; ++t)
        bias[t] = _mm256_add_epi32(bias[t], _mm256_madd_epi16(pair, broadcast4(reinterpret_cast<const int8_t*>(a[t]->sum16 + 2 * k))));
    }
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const __m256i total = _mm256_sub_epi32(dots[t], _mm256_slli_epi32(bias[t], T == DType::Q6_K ? 5 : 2));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, _mm256_set1_ps(a[t]->d)), acc[t]);
    }
  } else if constexpr (T == DType::Q2_K) {  // w = d scale_g q - dmin min_g
    #pragma GCC unroll 16
    for (int k = 0; k < 8; ++k) {
      const __m256i pair = pairs_high4(sb + 32 + 16 * k, sb + 40 + 16 * k);
      #pragma GCC unroll 16
      for (int t = 0; t < N; ++t)
        bias[t] = _mm256_add_epi32(bias[t], _mm256_madd_epi16(pair, broadcast4(reinterpret_cast<const int8_t*>(a[t]->sum16 + 2 * k))));
    }
    const __m256 neg_dmin = load_f16x8(sb + 16);
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const __m256 dx = _mm256_set1_ps(a[t]->d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[t]), _mm256_mul_ps(d, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bias[t]), _mm256_mul_ps(neg_dmin, dx), acc[t]);
    }
  } else {
    #pragma GCC unroll 16
    for (int k = 0; k < 4; ++k) {
      const __m256i pair = pairs_u8(sb + 96 + 16 * k, sb + 104 + 16 * k);
      #pragma GCC unroll 16
      for (int t = 0; t < N; ++t)
        bias[t] = _mm256_add_epi32(bias[t], _mm256_madd_epi16(pair, broadcast4(reinterpret_cast<const int8_t*>(a[t]->sum32 + 2 * k))));
    }
    const __m256 neg_dmin = load_f16x8(sb + 16);
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const __m256 dx = _mm256_set1_ps(a[t]->d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[t]), _mm256_mul_ps(d, dx), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(bias[t]), _mm256_mul_ps(neg_dmin, dx), acc[t]);
    }
  }
}

// 8 rows of one group x tokens [t0, t0 + N) into out[N][8].
template <DType T, int N>
static void group_tokens(const PackedJob& job, const uint8_t* group, int64_t t0, float* out) {
  using L = Layout<T>;
  const int64_t n_sb = job.cols / L::kValues;
  PackedActRow rows[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) rows[t] = packed_act_row(job.xq + static_cast<size_t>(t0 + t) * job.xq_row_bytes, job.cols);
  __m256 acc[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  using Act = std::conditional_t<is_256(T), PackedAct256, PackedAct32>;
  for (int64_t b = 0; b < n_sb; ++b) {
    const int8_t* x[N];
    const Act* a[N];
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      x[t] = rows[t].qs + b * L::kValues;
      a[t] = static_cast<const Act*>(rows[t].blocks) + b;
    }
    const uint8_t* sb = group + static_cast<size_t>(b) * L::kBytes;
    if constexpr (is_256(T)) block256<T, N>(sb, x, a, acc);
    else block32<T, N>(sb, x, a, acc);
  }
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + 8 * t, acc[t]);
}

template <DType T, int N>
static void group_tokens_store(const PackedJob& job, int64_t g, int64_t t0) {
  float out[N * 8];
  group_tokens<T, N>(job, job.w + static_cast<size_t>(g) * job.group_bytes, t0, out);
  const int64_t valid = std::min<int64_t>(8, job.rows - 8 * g);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) std::memcpy(job.y + (t0 + t) * job.rows + 8 * g, out + 8 * t, sizeof(float) * static_cast<size_t>(valid));
}

// 1 <= n <= kMaxN tokens from t0.
template <DType T, int kMaxN>
static void group_tokens_n(const PackedJob& job, int64_t g, int64_t t0, int64_t n) {
  if constexpr (kMaxN > 1) {
    if (n < kMaxN) return group_tokens_n<T, kMaxN - 1>(job, g, t0, n);
  }
  group_tokens_store<T, kMaxN>(job, g, t0);
}

// Row groups [g0, g1) for all tokens. Prefill takes the tokens in tiles whose
// activations stay in L2 while the groups stream past; every (row, token)
// takes the same arithmetic whatever the tile or the call's token count.
template <DType T, int kMaxN>
static void packed_rows(const PackedJob& job, int64_t g0, int64_t g1) {
  constexpr size_t kTileBytes = 192 * 1024;
  int64_t tile = job.n_tokens;
  if (tile > 16) {
    tile = std::max<int64_t>(kMaxN, static_cast<int64_t>(kTileBytes / job.xq_row_bytes) / kMaxN * kMaxN);
  }
  for (int64_t t0 = 0; t0 < job.n_tokens; t0 += tile) {
    const int64_t t1 = std::min(job.n_tokens, t0 + tile);
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t t = t0; t < t1; t += kMaxN) group_tokens_n<T, kMaxN>(job, g, t, std::min<int64_t>(kMaxN, t1 - t));
  }
}

template <int kMaxN>
static PackedKernels make_packed_kernels() {
  return {packed_rows<DType::Q4_0, kMaxN>, packed_rows<DType::Q4_1, kMaxN>, packed_rows<DType::Q5_0, kMaxN>,
          packed_rows<DType::Q5_1, kMaxN>, packed_rows<DType::Q8_0, kMaxN>,
          packed_rows<DType::IQ4_NL, kMaxN>, packed_rows<DType::IQ4_XS, kMaxN>,
          packed_rows<DType::Q2_K, kMaxN>, packed_rows<DType::Q3_K, kMaxN>, packed_rows<DType::Q4_K, kMaxN>, packed_rows<DType::Q5_K, kMaxN>,
          packed_rows<DType::Q6_K, kMaxN>};
}

}  // namespace packed_simd
}  // namespace kvserve
