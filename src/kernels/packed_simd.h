#pragma once
// Internal: the packed 8-bit-activation kernels (kernels/repack.h) as
// templates, instantiated by matmul_packed_avx2.cpp and _avx512.cpp with their
// own instruction sets (hence every function is static).
//
// One call computes one or two packed groups (8 rows each) x N tokens. Each
// 32-bit lane is one row: a chunk register (4 values of 8 rows, or of 16 rows
// from two adjacent groups in a 512-bit register) meets a token's 4 activation
// bytes broadcast to all lanes in maddubs (u8 weights x s8 activations -> s16
// pairs), the s16 sums of a few chunks are folded into s32 by madd with the
// rows' integer scales (1 for the 32-value types), and each super-block ends
// with the float multiply-adds of repack.h's reference, in the same order.
// Every operation is lane-local, so a row's result is the same bit for bit in
// a 256-bit or a 512-bit register (batch invariance does not depend on it).
// Bounds that keep the s16 sums exact: a pair is at most 2 x 15 x 127 (4-bit),
// 2 x 31 x 127 (5-bit), 2 x 63 x 127 (6-bit), 2 x 128 x 127 (Q8_0, signs moved
// onto the activations), 2 x 127 x 127 (IQ4 levels, likewise), so 8, 4, 2, 1
// and 1 chunks fit under 32767.
// 256-value types: each fold's s32 product is shifted left by the token's
// sub-block shift (PackedAct256, 0..3) before it joins the super-block's
// sum; one shift per fold and token (a separate accumulator per sub-block
// would cost a shift and an add, and N more registers). The largest sum,
// Q6_K's, stays under 2^31 (repack.cpp).
// With AVX-512 VNNI (the AVX-512 table) the signed-weight types take vpdpbusd:
// Q8_0 is stored biased (w + 128, repack.h) and IQ4 levels are looked up
// biased, so four u8 x s8 products go straight into a row's s32 lane, and the
// bias comes off through the activations' block sums (128 sum(q)). That
// replaces the sign move, maddubs, madd and add of each chunk and token; the
// integer sums, and so the results, are the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "kernels/packed_kernels.h"
#include "kernels/packed_simd_registers.h"
#include "kernels/repack.h"

namespace kvserve {
namespace packed_simd {

// Whether type t's integer dots take vpdpbusd (s32 sums, folded with a 32-bit
// multiply) rather than maddubs + add (s16 sums folded with madd). Every type
// but Q4_K gained on Zen 4 (microbench_gemm, 8960 x 1536, 512 tokens: Q5_0 +25-30%,
// Q6_K +25-40%, Q4_0 +24%, Q5_K +23%, Q3_K +25%, Q2_K +8%); Q4_K lost 8-10%:
// it already folds once per sub-block, and the 32-bit multiply costs more
// than the madd it replaces.
constexpr bool vnni_dots(DType t) { return kVnni && t != DType::Q4_K; }

// Row r's scale s_r from 8 unsigned / signed bytes s_0..s_7, in the form
// fold() multiplies by: lane r = (s_r, s_r) as two s16 for madd, or s_r as
// one s32 for VNNI's 32-bit multiply.
template <typename V, bool kDp>
static inline typename V::I scale_pairs_u8(Rows p) {
  const auto v = V::u8_lanes(p);
  if constexpr (kDp) return v;
  return or_(v, shl32<16>(v));
}
template <typename V, bool kDp>
static inline typename V::I scale_pairs_i8(Rows p) {
  const auto v = V::i8_lanes(p);
  if constexpr (kDp) return v;
  return or_(and_(v, V::set32(0xffff)), shl32<16>(v));
}
// The same from the low nibbles of 8 bytes (Q2_K scales).
template <typename V, bool kDp>
static inline typename V::I scale_pairs_low4(Rows p) {
  const auto v = and_(V::u8_lanes(p), V::set32(15));
  if constexpr (kDp) return v;
  return or_(v, shl32<16>(v));
}
static inline __m128i same(__m128i v) { return v; }
static inline __m128i high4(__m128i v) { return _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15)); }

// h shifted by kLeft bits within each 16-bit lane (right for a negative kLeft).
template <int kLeft, typename I>
static inline I shift16(I h) {
  if constexpr (kLeft > 0) return shl16<kLeft>(h);
  else if constexpr (kLeft < 0) return shr16<-kLeft>(h);
  else return h;
}
// Bit kBit of every byte moved to bit 4 (the Q5 fifth bits).
template <int kBit, typename I>
static inline I fifth_bit(I h, I mask) { return and_(shift16<4 - kBit>(h), mask); }
// Bits 2k, 2k + 1 of every byte moved to bits 4, 5 (the Q6_K top bits).
template <int kPair, typename I>
static inline I top_bits(I h, I mask) { return and_(shift16<4 - 2 * kPair>(h), mask); }
// Bit kBit of every byte moved to bit 2 (the Q3_K high bits).
template <int kBit, typename I>
static inline I third_bit(I h, I mask) { return and_(shift16<2 - kBit>(h), mask); }

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

// acc + u x s over each lane's 4 byte pairs (u unsigned, s signed): s16
// sums with maddubs + add (each pair <= 2 x 63 x 127 for the callers), or s32
// sums with VNNI's vpdpbusd.
template <bool kDp, typename I>
static inline I dot4(I acc, I u, I s) {
#ifdef __AVX512VNNI__
  if constexpr (kDp) return dpbusd(acc, u, s);
#endif
  return add16(acc, maddubs(u, s));
}

// Adds chunk p's two weight registers (chunks 2p, 2p + 1 of sub-block q) times
// each token's activations x[t] (that sub-block's 32 bytes) into acc16[t].
template <DType T, typename V, int N, int kP>
static inline void chunk_pair(Rows q, const int8_t* const (&x)[N], typename V::I (&acc16)[N]) {
  using I = typename V::I;
  const I nibbles = V::set8(0x0f);
  const I packed = V::load(q + 32 * kP);
  I lo = and_(packed, nibbles);
  I hi = and_(shr16<4>(packed), nibbles);
  if constexpr (has_fifth_bit(T)) {
    const I h = V::load(q + 128), mask = V::set8(0x10);
    lo = or_(lo, fifth_bit<2 * kP>(h, mask));
    hi = or_(hi, fifth_bit<2 * kP + 1>(h, mask));
  }
  if constexpr (T == DType::Q6_K) {
    const I h = V::load(q + 128 + 32 * (kP / 2)), mask = V::set8(0x30);
    lo = or_(lo, top_bits<(2 * kP) % 4>(h, mask));
    hi = or_(hi, top_bits<(2 * kP + 1) % 4>(h, mask));
  }
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    acc16[t] = dot4<vnni_dots(T)>(acc16[t], lo, V::broadcast4(x[t] + 8 * kP));
    acc16[t] = dot4<vnni_dots(T)>(acc16[t], hi, V::broadcast4(x[t] + 8 * kP + 4));
    if constexpr (N > 1) pin(acc16[t]);  // one token: 16 registers suffice, let GCC schedule
  }
}

// Each token's shift of the 32-value sub-block being summed (PackedAct256): its
// scaled dots count 2^shift times at the super-block's scale.
template <int N>
struct SubBlockShifts {
  __m128i count[N];  // the shift in the low 64 bits, as shl32_by takes it
};
// No shift (the 32-value types: block32 shifts each half's sum itself).
struct NoShifts {};

// acc32[t] += (acc16[t] x scale) << shift (madd of s16 pairs; VNNI: s32 sums
// times s32 scales); acc16[t] = 0. The shifted products stay far below 2^31
// (packed_simd.h's header, repack.cpp's Q6_K bound).
template <typename V, int N, bool kDp, typename Shifts>
static inline void fold(typename V::I (&acc16)[N], typename V::I scale, const Shifts& shifts,
                        typename V::I (&acc32)[N]) {
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    typename V::I scaled;
    if constexpr (kDp) scaled = mullo32(acc16[t], scale);
    else scaled = madd(acc16[t], scale);
    if constexpr (!std::is_same_v<Shifts, NoShifts>) scaled = shl32_by(scaled, shifts.count[t]);
    acc32[t] = add32(acc32[t], scaled);
    acc16[t] = V::zero();
  }
}

// One chunk of signed weights w (IQ4 levels, |w| <= 127; Q8_0) times each
// token's 4 activation bytes at x[t] + 4c, signs moved onto the activations,
// scaled by `scale` into acc32[t] (one chunk per fold).
template <typename V, int N>
static inline void signed_chunk(typename V::I w, const int8_t* const (&x)[N], int c, typename V::I scale,
                                typename V::I (&acc32)[N]) {
  const auto w_abs = abs8(w);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    const auto xs = sign_of(V::broadcast4(x[t] + 4 * c), w);
    acc32[t] = add32(acc32[t], madd(maddubs(w_abs, xs), scale));
  }
}

// VNNI: one chunk of biased weights (w + 128) times each token's 4
// activation bytes at x[t] + 4c, unscaled, into acc32[t]; the caller takes
// 128 sum(q) off.
template <typename V, int N>
static inline void biased_chunk(typename V::I w, const int8_t* const (&x)[N], int c, typename V::I (&acc32)[N]) {
#ifdef __AVX512VNNI__
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc32[t] = dpbusd(acc32[t], w, V::broadcast4(x[t] + 4 * c));
#else
  (void)w, (void)x, (void)c, (void)acc32;
#endif
}

// IQ4 sub-block: each 4-bit plane register's nibbles (chunks 2p, 2p + 1)
// looked up in kIQ4NLValues (VNNI: biased by 128, unscaled sums); registers
// p = kFirst .. kFirst + kCount - 1.
template <typename V, int N, int kFirst = 0, int kCount = 4>
static inline void level_dots(Rows q, const int8_t* const (&x)[N], typename V::I scale, typename V::I (&acc32)[N]) {
  using I = typename V::I;
  const I levels = kVnni ? V::biased_levels() : V::levels();
  const I nibbles = V::set8(0x0f);
  unroll<kCount>([&](auto i) {
    constexpr int p = kFirst + decltype(i)::value;
    const I packed = V::load(q + 32 * p);
    const I lo = lookup(levels, and_(packed, nibbles)), hi = lookup(levels, and_(shr16<4>(packed), nibbles));
    if constexpr (kVnni) {
      biased_chunk<V>(lo, x, 2 * p, acc32);
      biased_chunk<V>(hi, x, 2 * p + 1, acc32);
    } else {
      signed_chunk<V>(lo, x, 2 * p, scale, acc32);
      signed_chunk<V>(hi, x, 2 * p + 1, scale, acc32);
    }
  });
}

// Q2_K / Q3_K sub-block: 2-bit plane register p holds chunks 4p + s in bits
// 2s, 2s + 1 (Q3_K: bit c of the high plane's bytes is chunk c's third bit,
// unsigned q + 4 in 0..7). Chunks 0..3 are one 16-value group (scale), 4..7
// the next (scale_hi); pairs <= 2 x 7 x 127, four of them fit s16.
template <DType T, typename V, int N, typename Shifts>
static inline void two_bit_dots(Rows q, const int8_t* const (&x)[N], typename V::I scale, typename V::I scale_hi,
                                const Shifts& shifts, typename V::I (&acc32)[N]) {
  using I = typename V::I;
  I acc16[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc16[t] = V::zero();
  unroll<2>([&](auto p) {
    const I packed = V::load(q + 32 * p);
    unroll<4>([&](auto s) {
      constexpr int c = 4 * decltype(p)::value + decltype(s)::value;
      I w = and_(shr16<2 * decltype(s)::value>(packed), V::set8(3));
      if constexpr (T == DType::Q3_K) w = or_(w, third_bit<c>(V::load(q + 64), V::set8(0x04)));
      #pragma GCC unroll 16
      for (int t = 0; t < N; ++t) {
        acc16[t] = dot4<vnni_dots(T)>(acc16[t], w, V::broadcast4(x[t] + 4 * c));
        if constexpr (N > 1) pin(acc16[t]);
      }
    });
    fold<V, N, vnni_dots(T)>(acc16, decltype(p)::value == 0 ? scale : scale_hi, shifts, acc32);
  });
}

// The integer dots of one 32-value sub-block of a 256-value type, scaled by
// `scale` (Q6_K: scale_hi for chunks 4..7) and shifted by `shifts`.
template <DType T, typename V, int N, typename Shifts>
static inline void sub_block_dots(Rows q, const int8_t* const (&x)[N], typename V::I scale, typename V::I scale_hi,
                                  const Shifts& shifts, typename V::I (&acc32)[N]) {
  using I = typename V::I;
  if constexpr (is_two_bit(T)) {
    two_bit_dots<T, V, N>(q, x, scale, scale_hi, shifts, acc32);
    return;
  }
  constexpr bool kDp = vnni_dots(T);
  I acc16[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc16[t] = V::zero();
  unroll<4>([&](auto p) {
    chunk_pair<T, V, N, p>(q, x, acc16);
    if constexpr (T == DType::Q6_K) { if constexpr (!kDp || p % 2 == 1) fold<V, N, kDp>(acc16, p < 2 ? scale : scale_hi, shifts, acc32); }
    else if constexpr (has_fifth_bit(T) && !kDp) { if constexpr (p % 2 == 1) fold<V, N, kDp>(acc16, scale, shifts, acc32); }
    else if constexpr (p == 3) fold<V, N, kDp>(acc16, scale, shifts, acc32);
  });
}

// The unscaled integer dots of half kHalf (values 16 kHalf .. 16 kHalf + 15:
// chunks 4 kHalf .. 4 kHalf + 3) of a 32-value block into sum32[t].
template <DType T, typename V, int N, int kHalf>
static inline void half_dots(Rows q, const int8_t* const (&x)[N], typename V::I (&sum32)[N]) {
  using I = typename V::I;
  const I ones = V::set16(1);
  if constexpr (T == DType::Q8_0) {  // stored as w + 128 (w xor 0x80)
    unroll<4>([&](auto i) {
      constexpr int c = 4 * kHalf + decltype(i)::value;
      if constexpr (kVnni) biased_chunk<V>(V::load(q + 32 * c), x, c, sum32);
      else signed_chunk<V>(xor_(V::load(q + 32 * c), V::set8(char(0x80))), x, c, ones, sum32);
    });
  } else if constexpr (has_levels(T)) {
    level_dots<V, N, 2 * kHalf, 2>(q, x, ones, sum32);
  } else if constexpr (vnni_dots(T)) {  // s32 sums straight into sum32
    chunk_pair<T, V, N, 2 * kHalf>(q, x, sum32);
    chunk_pair<T, V, N, 2 * kHalf + 1>(q, x, sum32);
  } else {  // s16 sums (four chunks of pairs <= 2 x 31 x 127 fit), then s32
    I acc16[N];
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) acc16[t] = V::zero();
    chunk_pair<T, V, N, 2 * kHalf>(q, x, acc16);
    chunk_pair<T, V, N, 2 * kHalf + 1>(q, x, acc16);
    fold<V, N, false>(acc16, ones, NoShifts{}, sum32);
  }
}

// One 32-value super-block of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL for N
// tokens: each half's integer dot shifted by the token's shift for it
// (PackedAct32), the two added. A second sum per token instead of one chain:
// the shift would otherwise wait on the first half's last dot, and the two
// shorter chains measured faster than the one of eight (docs/kernels.md).
template <DType T, typename V, int N>
static inline void block32(Rows sb, const int8_t* const (&x)[N], const PackedAct32* const (&a)[N],
                           typename V::F (&acc)[N]) {
  typename V::I isum[N], half1[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) isum[t] = half1[t] = V::zero();
  const Rows q = sb + Layout<T>::kHeader;
  half_dots<T, V, N, 0>(q, x, isum);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) isum[t] = shl32_by(isum[t], &a[t]->shift[0]);
  half_dots<T, V, N, 1>(q, x, half1);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) isum[t] = add32(isum[t], shl32_by(half1[t], &a[t]->shift[1]));
  const auto d = V::f16(sb);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    if constexpr (T == DType::Q4_0) isum[t] = sub32(isum[t], V::set32(8 * a[t]->sum));
    if constexpr (T == DType::Q5_0) isum[t] = sub32(isum[t], V::set32(16 * a[t]->sum));
    if constexpr (kVnni && (T == DType::Q8_0 || T == DType::IQ4_NL)) isum[t] = sub32(isum[t], V::set32(128 * a[t]->sum));
    acc[t] = fmadd(to_float(isum[t]), mul(d, V::fset(a[t]->d)), acc[t]);
    if constexpr (has_min(T)) acc[t] = fmadd(V::f16(sb + 16), V::fset(a[t]->s), acc[t]);
  }
}

// bias[t] += sum over k of madd(pair(k), the token's 2 s16 sums at sums[t] + 2k).
template <typename V, int N, int kPairs, typename PairFn>
static inline void bias_dots(PairFn pair, const int16_t* const (&sums)[N], typename V::I (&bias)[N]) {
  #pragma GCC unroll 16
  for (int k = 0; k < kPairs; ++k) {
    const auto p = pair(k);
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t)
      bias[t] = add32(bias[t], madd(p, V::broadcast4(reinterpret_cast<const int8_t*>(sums[t] + 2 * k))));
  }
}

// IQ4_XS sub-block j (scales: the rows' 8 scale bytes) for N tokens into dots.
template <typename V, int N>
static inline void iq4_xs_sub_block(Rows q, Rows scales, const int8_t* const (&x)[N], const PackedAct256* const (&a)[N],
                                    int j, const SubBlockShifts<N>& shifts, typename V::I (&dots)[N]) {
  typename V::I sums[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) sums[t] = V::zero();
  if constexpr (kVnni) {  // unscaled biased sums: shifted, less 128 x the (shifted) sum of q, times the scale
    level_dots<V>(q, x, V::zero(), sums);
    const auto scale = V::i8_lanes(scales);
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const auto unbiased = sub32(shl32_by(sums[t], shifts.count[t]), V::set32(128 * a[t]->sum32[j]));
      dots[t] = add32(dots[t], mullo32(unbiased, scale));
    }
  } else {  // scaled sums, shifted
    level_dots<V>(q, x, scale_pairs_i8<V, false>(scales), sums);
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) dots[t] = add32(dots[t], shl32_by(sums[t], shifts.count[t]));
  }
}

// One 256-value super-block of Q2_K..Q6_K / IQ4_XS for N tokens; x[t] points
// at the super-block's activations.
template <DType T, typename V, int N>
static inline void block256(Rows sb, const int8_t* const (&x)[N], const PackedAct256* const (&a)[N],
                            typename V::F (&acc)[N]) {
  using L = Layout<T>;
  constexpr bool kDp = vnni_dots(T);
  typename V::I dots[N], bias[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) dots[t] = bias[t] = V::zero();
  for (int j = 0; j < 8; ++j) {
    const int8_t* xj[N];
    SubBlockShifts<N> shifts;
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      xj[t] = x[t] + 32 * j;
      shifts.count[t] = _mm_cvtsi32_si128(a[t]->shift[j]);
    }
    const Rows q = sb + (L::kHeader + static_cast<size_t>(j) * L::kSubBytes);
    if constexpr (T == DType::Q6_K || T == DType::Q3_K) {
      sub_block_dots<T, V, N>(q, xj, scale_pairs_i8<V, kDp>(sb + (16 + 16 * j)), scale_pairs_i8<V, kDp>(sb + (24 + 16 * j)),
                              shifts, dots);
    } else if constexpr (T == DType::Q2_K) {
      sub_block_dots<T, V, N>(q, xj, scale_pairs_low4<V, kDp>(sb + (32 + 16 * j)),
                              scale_pairs_low4<V, kDp>(sb + (40 + 16 * j)), shifts, dots);
    } else if constexpr (T == DType::IQ4_XS) {
      iq4_xs_sub_block<V, N>(q, sb + (16 + 8 * j), xj, a, j, shifts, dots);
    } else {
      const auto scale = scale_pairs_u8<V, kDp>(sb + (32 + 8 * j));
      sub_block_dots<T, V, N>(q, xj, scale, scale, shifts, dots);
    }
  }
  const auto d = V::f16(sb);
  if constexpr (T == DType::IQ4_XS) {
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) acc[t] = fmadd(to_float(dots[t]), mul(d, V::fset(a[t]->d)), acc[t]);
    return;
  }
  const int16_t* sums[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) sums[t] = T == DType::Q4_K || T == DType::Q5_K ? a[t]->sum32 : a[t]->sum16;
  if constexpr (T == DType::Q6_K || T == DType::Q3_K) {  // w = d scale_g (q - 32), d scale_g (q - 4)
    bias_dots<V, N, 8>([&](int k) { return V::i8_pairs(sb + (16 + 16 * k), sb + (24 + 16 * k)); }, sums, bias);
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const auto total = sub32(dots[t], shl32<T == DType::Q6_K ? 5 : 2>(bias[t]));
      acc[t] = fmadd(to_float(total), mul(d, V::fset(a[t]->d)), acc[t]);
    }
    return;
  }
  if constexpr (T == DType::Q2_K) {  // w = d scale_g q - dmin min_g
    bias_dots<V, N, 8>([&](int k) { return V::u8_pairs(sb + (32 + 16 * k), sb + (40 + 16 * k), high4); }, sums, bias);
  } else {
    bias_dots<V, N, 4>([&](int k) { return V::u8_pairs(sb + (96 + 16 * k), sb + (104 + 16 * k), same); }, sums, bias);
  }
  const auto neg_dmin = V::f16(sb + 16);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    const auto dx = V::fset(a[t]->d);
    acc[t] = fmadd(to_float(dots[t]), mul(d, dx), acc[t]);
    acc[t] = fmadd(to_float(bias[t]), mul(neg_dmin, dx), acc[t]);
  }
}

// V::kRows rows from group g (with group g + 1 when V holds two; stride 0
// repeats group g for a lone last group) x tokens [t0, t0 + N) into
// out[N][V::kRows].
template <DType T, typename V, int N>
static void group_tokens(const PackedJob& job, Rows group, int64_t t0, float* out) {
  using L = Layout<T>;
  const int64_t n_sb = job.cols / L::kValues;
  PackedActRow rows[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) rows[t] = packed_act_row(job.xq + static_cast<size_t>(t0 + t) * job.xq_row_bytes, job.cols);
  typename V::F acc[N];
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc[t] = V::fzero();
  using Act = std::conditional_t<is_256(T), PackedAct256, PackedAct32>;
  // A 32-value block's record (32 bytes) sits this far after its values: one
  // offset for every token, so that the half shifts read in the middle of a
  // block need no pointer register per token (8 tokens had spilled them).
  const int64_t records = static_cast<const uint8_t*>(rows[0].blocks) - reinterpret_cast<const uint8_t*>(rows[0].qs);
  for (int64_t b = 0; b < n_sb; ++b) {
    const int8_t* x[N];
    const Act* a[N];
    #pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      x[t] = rows[t].qs + b * L::kValues;
      if constexpr (is_256(T)) a[t] = static_cast<const Act*>(rows[t].blocks) + b;
      else a[t] = reinterpret_cast<const Act*>(x[t] + records);
    }
    const Rows sb = group + static_cast<size_t>(b) * L::kBytes;
    if constexpr (is_256(T)) block256<T, V, N>(sb, x, a, acc);
    else block32<T, V, N>(sb, x, a, acc);
  }
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t) V::store(out + V::kRows * t, acc[t]);
}

template <DType T, typename V, int N>
static void group_tokens_store(const PackedJob& job, int64_t g, int64_t g_end, int64_t t0) {
  float out[N * V::kRows];
  const bool pair = V::kRows == 16 && g + 1 < g_end;
  const Rows group{job.w + static_cast<size_t>(g) * job.group_bytes, pair ? job.group_bytes : 0};
  group_tokens<T, V, N>(job, group, t0, out);
  const int64_t valid = std::min<int64_t>(pair ? 16 : 8, job.rows - 8 * g);
  #pragma GCC unroll 16
  for (int t = 0; t < N; ++t)
    std::memcpy(job.y + (t0 + t) * job.rows + 8 * g, out + V::kRows * t, sizeof(float) * static_cast<size_t>(valid));
}

// 1 <= n <= kMaxN tokens from t0.
template <DType T, typename V, int kMaxN>
static void group_tokens_n(const PackedJob& job, int64_t g, int64_t g_end, int64_t t0, int64_t n) {
  if constexpr (kMaxN > 1) {
    if (n < kMaxN) return group_tokens_n<T, V, kMaxN - 1>(job, g, g_end, t0, n);
  }
  group_tokens_store<T, V, kMaxN>(job, g, g_end, t0);
}

// Row groups [g0, g1) for all tokens, V::kRows / 8 groups a call. Prefill
// takes the tokens in tiles whose activations stay in L2 while the groups
// stream past; every (row, token) takes the same arithmetic whatever the tile
// or the call's token count.
template <DType T, typename V, int kMaxN>
static void packed_rows(const PackedJob& job, int64_t g0, int64_t g1) {
  constexpr size_t kTileBytes = 192 * 1024;
  constexpr int64_t kGroups = V::kRows / 8;
  int64_t tile = job.n_tokens;
  if (tile > 16) {
    tile = std::max<int64_t>(kMaxN, static_cast<int64_t>(kTileBytes / job.xq_row_bytes) / kMaxN * kMaxN);
  }
  for (int64_t t0 = 0; t0 < job.n_tokens; t0 += tile) {
    const int64_t t1 = std::min(job.n_tokens, t0 + tile);
    for (int64_t g = g0; g < g1; g += kGroups)
      for (int64_t t = t0; t < t1; t += kMaxN)
        group_tokens_n<T, V, kMaxN>(job, g, g1, t, std::min<int64_t>(kMaxN, t1 - t));
  }
}

#ifdef __AVX512BW__
// The AVX-512 table: up to four tokens (decode, small batches, speculative
// verification) in 256-bit registers, more in 512-bit ones (the same bits
// either way). Zen 4, Qwen2.5-Coder-1.5B Q4_K_M, 2 threads: 512-bit took
// prefill from 91.5 to 106.3 tokens/s but decode from 26-34 to 22-23 (one
// token's chains are latency-bound, and double-pumped 512-bit operations
// lengthen them); a pass over 2 / 3 tokens went from 41 / 46 ms to 30-32 /
// 37-38 ms in 256-bit registers, 4 tokens alike, 5 and more slower
// (docs/kernels.md, "Small batches in 256-bit registers").
template <DType T, int kMaxN>
static void packed_rows_wide(const PackedJob& job, int64_t g0, int64_t g1) {
  constexpr int64_t kYmmTokens = 4;
  if (job.n_tokens == 1) return packed_rows<T, Ymm, 1>(job, g0, g1);
  if (job.n_tokens <= kYmmTokens) return packed_rows<T, Ymm, kYmmTokens>(job, g0, g1);
  packed_rows<T, Zmm, kMaxN>(job, g0, g1);
}

template <int kMaxN>
static PackedKernels make_wide_packed_kernels() {
  return {packed_rows_wide<DType::Q4_0, kMaxN>,   packed_rows_wide<DType::Q4_1, kMaxN>,
          packed_rows_wide<DType::Q5_0, kMaxN>,   packed_rows_wide<DType::Q5_1, kMaxN>,
          packed_rows_wide<DType::Q8_0, kMaxN>,   packed_rows_wide<DType::IQ4_NL, kMaxN>,
          packed_rows_wide<DType::IQ4_XS, kMaxN>, packed_rows_wide<DType::Q2_K, kMaxN>,
          packed_rows_wide<DType::Q3_K, kMaxN>,   packed_rows_wide<DType::Q4_K, kMaxN>,
          packed_rows_wide<DType::Q5_K, kMaxN>,   packed_rows_wide<DType::Q6_K, kMaxN>};
}
#endif

template <typename V, int kMaxN>
static PackedKernels make_packed_kernels() {
  return {packed_rows<DType::Q4_0, V, kMaxN>,   packed_rows<DType::Q4_1, V, kMaxN>,
          packed_rows<DType::Q5_0, V, kMaxN>,   packed_rows<DType::Q5_1, V, kMaxN>,
          packed_rows<DType::Q8_0, V, kMaxN>,   packed_rows<DType::IQ4_NL, V, kMaxN>,
          packed_rows<DType::IQ4_XS, V, kMaxN>, packed_rows<DType::Q2_K, V, kMaxN>,
          packed_rows<DType::Q3_K, V, kMaxN>,   packed_rows<DType::Q4_K, V, kMaxN>,
          packed_rows<DType::Q5_K, V, kMaxN>,   packed_rows<DType::Q6_K, V, kMaxN>};
}

}  // namespace packed_simd
}  // namespace kvserve
