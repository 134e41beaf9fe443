#pragma once
// Internal to src/kernels: AVX2-level helpers shared by the Q5_0 / Q5_1 / K-quant
// kernels of the avx2 and avx512 translation units. Everything here is
// `static` or a template, so each TU gets its own copy compiled with its own
// instruction set (see kernel_table.h); each TU instantiates Q8RowDot with
// its own Format types (in an anonymous namespace) for the same reason.
#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace kquants_simd {

static inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline __m256i load_act(const int8_t* qx) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(qx)); }
// Eight bytes zero-extended to eight int32 lanes.
static inline __m256i widen8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
static inline __m256i mask_bytes(__m256i v, int m) { return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(m))); }

// sum over 32 bytes of unsigned w * signed a, as 8 int32 lanes.
static inline __m256i dot_u8_s8(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

// Bit j of `bits` (j < 32) as 0x10 in byte j: byte j takes input byte j / 8,
// keeps bit j % 8, and compares.
static inline __m256i bits_to_0x10_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return mask_bytes(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), 0x10);
}

// The 32 unsigned 5-bit q of a Q5_0 or Q5_1 block as bytes in element order.
template <typename Block>
static inline __m256i q5_bytes(const Block& b) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m256i nibbles = mask_bytes(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), 0x0f);
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  return _mm256_or_si256(nibbles, bits_to_0x10_bytes(qh));
}

// The 32 signed levels of 16 bytes of IQ4 indices (Q4_0's nibble order:
// element j < 16 low nibble of qs[j], j + 16 its high nibble) in element order.
static inline __m256i iq4_levels(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i index = mask_bytes(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), 0x0f);
  const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
  return _mm256_shuffle_epi8(levels, index);
}

// The offset w = d q + offset adds: -16 d for Q5_0, m for Q5_1.
static inline float q5_offset(const BlockQ5_0& b) { return -16.0f * _cvtsh_ss(b.d); }
static inline float q5_offset(const BlockQ5_1& b) { return _cvtsh_ss(b.m); }

// The fifth bits of Q5_K chunk k (values 64k .. 64k + 63), as 0x10 per byte:
// qh[l] bit 2k for value 64k + l, bit 2k + 1 for 64k + 32 + l. Shifting 16-bit
// lanes keeps bit 4 of each byte within its byte for these shift counts.
static inline __m256i q5_k_high(__m256i qh, int bit) {
  const __m256i moved = bit <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - bit))
                                 : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(bit - 4));
  return mask_bytes(moved, 0x10);
}

// Chunk k (values 64k .. 64k + 63) of a Q4_K / Q5_K block as unsigned bytes:
// q[0] the first 32 values (low nibbles, plus the fifth bit for Q5_K),
// q[1] the next 32 (high nibbles).
template <typename BlockT, int kBits>
static inline void k_quant_chunk(const BlockT& b, int k, __m256i q[2]) {
  const __m256i bytes = load32(b.qs + 32 * k);
  q[0] = mask_bytes(bytes, 0x0f);
  q[1] = mask_bytes(_mm256_srli_epi16(bytes, 4), 0x0f);
  if constexpr (kBits == 5) {
    const __m256i qh = load32(b.qh);
    q[0] = _mm256_or_si256(q[0], q5_k_high(qh, 2 * k));
    q[1] = _mm256_or_si256(q[1], q5_k_high(qh, 2 * k + 1));
  }
}

// Half h (values 128h .. 128h + 127) of a Q6_K block as unsigned 6-bit bytes,
// q[g] holding values 128h + 32g .. 128h + 32g + 31.
static inline void q6_k_half(const BlockQ6_K& b, int h, __m256i q[4]) {
  const __m256i a = load32(b.ql + 64 * h), c = load32(b.ql + 64 * h + 32), qh = load32(b.qh + 32 * h);
  q[0] = _mm256_or_si256(mask_bytes(a, 0x0f), mask_bytes(_mm256_slli_epi16(qh, 4), 0x30));
  q[1] = _mm256_or_si256(mask_bytes(c, 0x0f), mask_bytes(_mm256_slli_epi16(qh, 2), 0x30));
  q[2] = _mm256_or_si256(mask_bytes(_mm256_srli_epi16(a, 4), 0x0f), mask_bytes(qh, 0x30));
  q[3] = _mm256_or_si256(mask_bytes(_mm256_srli_epi16(c, 4), 0x0f), mask_bytes(_mm256_srli_epi16(qh, 2), 0x30));
}

// Values 32 j .. 32 j + 31 of a Q2_K / Q3_K block's low two bits as bytes:
// bits 2 (j % 4), 2 (j % 4) + 1 of qs[32 (j / 4) .. + 31].
static inline __m256i two_bit_values(const uint8_t* qs, int j) {
  return mask_bytes(_mm256_srl_epi16(load32(qs + 32 * (j / 4)), _mm_cvtsi32_si128(2 * (j % 4))), 3);
}

// Q3_K values 32 j .. 32 j + 31 as signed bytes (-4..3): the low two bits,
// minus 4 where bit j of hmask[l] is clear.
static inline __m256i q3_k_values(const BlockQ3_K& b, int j) {
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(load32(b.hmask), bit), bit);
  return _mm256_sub_epi8(two_bit_values(b.qs, j), _mm256_andnot_si256(set, _mm256_set1_epi8(4)));
}

// ---- Per-super-block vectors, one lane per 32-value sub-block ----------
//
// A 256-value block's eight sub-block dots are summed across lanes into one
// vector, so the float scaling costs one multiply-add per block and token
// instead of one per sub-block. The lane order that falls out of the
// horizontal adds is kSubBlockOrder = {0, 1, 4, 5, 2, 3, 6, 7}; the weight and
// activation scales are arranged to match it.

// _mm256_hadd_epi32(u, v) for lanes within int16 range: pack, then add
// pairs. Measured faster than hadd (several uops) on this Zen 4: the q8 Q4_K
// pass, 1.12 vs 1.47 ms for 5 tokens on 8960x1536.
static inline __m256i add_pairs(__m256i u, __m256i v) {
  return _mm256_madd_epi16(_mm256_packs_epi32(u, v), _mm256_set1_epi16(1));
}

// The sum of each of eight int32 vectors' lanes, in kSubBlockOrder. Every
// lane and every pair sum of two lanes must fit int16: a 4-product lane of
// the K-quants' dots is at most 4 * 32 * 127 = 16256.
static inline __m256i sum_sub_blocks(const __m256i dot[8]) {
  const __m256i a = add_pairs(add_pairs(dot[0], dot[1]), add_pairs(dot[4], dot[5]));
  const __m256i b = add_pairs(add_pairs(dot[2], dot[3]), add_pairs(dot[6], dot[7]));
  // a: [0, 1, 4, 5] per 128-bit half, b: [2, 3, 6, 7]; add the halves.
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// One token's activation scales of a 256-value block (8 {d, s} pairs), as
// d and s vectors in kSubBlockOrder.
struct ActSubScales {
  __m256 d, s;
};
static inline ActSubScales act_sub_scales(const Q8ActScale* sc) {
  const __m256 first = _mm256_loadu_ps(&sc[0].d), second = _mm256_loadu_ps(&sc[4].d);
  return {_mm256_shuffle_ps(first, second, 0x88), _mm256_shuffle_ps(first, second, 0xdd)};
}

// Q4_K / Q5_K sub-block scales and mins as exact floats in kSubBlockOrder
// (kquant_scale_min for all j at once, on 32-bit words as in ggml).
struct KSubScaleMins {
  __m256 scale, min;
};
static inline KSubScaleMins k_scale_mins(const uint8_t* packed) {
  uint32_t w[3];
  std::memcpy(w, packed, sizeof(w));
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kTop2 = 0x03030303;
  const uint32_t scales_0_3 = w[0] & kLow6, mins_0_3 = w[1] & kLow6;
  const uint32_t scales_4_7 = (w[2] & kLow4) | (((w[0] >> 6) & kTop2) << 4);
  const uint32_t mins_4_7 = ((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kTop2) << 4);
  const __m128i bytes = _mm_setr_epi32(static_cast<int>(scales_0_3), static_cast<int>(scales_4_7),
                                       static_cast<int>(mins_0_3), static_cast<int>(mins_4_7));
  const __m128i ordered = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(ordered)),
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(ordered, ordered)))};
}

// 8-bit activations, R rows x N tokens per call. Format::q8_block<N>(block,
// a, b, acc, offset) unpacks weight block b of one row once (bits, sub-block
// scales) and adds its dot with all N tokens' activations a[i]: the
// float-scaled part to acc[i] (8 lanes), the offset term to offset[i]. So a
// pass over n tokens unpacks each block once per kTokens tokens, not per token.
template <typename Format, int kTokens>
struct Q8RowDot {
  static constexpr int kMaxTokens = kTokens;
  // Two far-apart rows (two prefetch streams) up to 4 tokens: q4_k
  // 8960x1536, 3 tokens 0.71 vs 0.79 ms; for 5..8 tokens two rows measured slower.
  static constexpr int rows_for(int n) { return n == 1 ? 4 : n <= 4 ? 2 : 1; }
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    using Block = typename Format::Block;
    const int64_t n_blocks = job.cols / Format::kValues;
    const Block* blocks[R];
    Q8ActRow a[N];
    __m256 acc[R][N];
    float offset[R][N];
    for (int i = 0; i < N; ++i) a[i] = q8_act_row(job, first_token + i);
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
      for (int i = 0; i < N; ++i) {
        acc[r][i] = _mm256_setzero_ps();
        offset[r][i] = 0.0f;
      }
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) Format::template q8_block<N>(blocks[r][b], a, b, acc[r], offset[r]);
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(acc[r][i]) + offset[r][i];
  }
};

// Token i's activations of values 32 j .. 32 j + 31 of weight block b (of
// kValues values) and their scale.
template <int kValues>
static inline __m256i act_bytes(const Q8ActRow& a, int64_t b, int j) { return load_act(a.qs + b * kValues + 32 * j); }
template <int kValues>
static inline Q8ActScale act_scale(const Q8ActRow& a, int64_t b, int j) { return a.scales[b * (kValues / 32) + j]; }

// ---- Q4_K / Q5_K / Q6_K with 8-bit activations, shared by both ISAs ----
//
// Each q8_block<N> unpacks one weight block and its scales once, then per
// token sums its sub-block dots across lanes (sum_sub_blocks) and scales the
// sums with one or two multiply-adds. Dot is the ISA's integer dot: u8_s8(w,
// a) (4-product int32 lane sums of unsigned w times signed a) and q6(q, a),
// the same for (q - 32) with q unsigned 6-bit.

// Q4_K / Q5_K: sub-block j adds d sc_j dx_j dot_j - dmin m_j s_j.
// Q5_0 / Q5_1 with 8-bit activations: w = d q + q5_offset (q <= 31
// unsigned), the block unpacked once for the call's N tokens; Dot::u8_s8 is
// the ISA's integer dot.
template <typename BlockT, typename Dot>
struct Q8Q5 {
  using Block = BlockT;
  static constexpr int kValues = 32;
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc,
                                              float* offset) {
    const float d = _cvtsh_ss(b.d), o = q5_offset(b);
    const __m256i q = q5_bytes(b);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const Q8ActScale s = act_scale<kValues>(a[i], block, 0);
      const __m256 dot = _mm256_cvtepi32_ps(Dot::u8_s8(q, act_bytes<kValues>(a[i], block, 0)));
      acc[i] = _mm256_fmadd_ps(dot, _mm256_set1_ps(d * s.d), acc[i]);
      offset[i] += o * s.s;
    }
  }
};
template <typename Dot>
using Q8Q5_0 = Q8Q5<BlockQ5_0, Dot>;
template <typename Dot>
using Q8Q5_1 = Q8Q5<BlockQ5_1, Dot>;

// IQ4_NL with 8-bit activations: w = d * level (signed levels, no offset);
// Dot::s8_s8 is the ISA's signed x signed dot (|level|, |a| <= 127).
template <typename Dot>
struct Q8IQ4_NL {
  using Block = BlockIQ4_NL;
  static constexpr int kValues = kQK4_NL;
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc, float*) {
    const float d = _cvtsh_ss(b.d);
    const __m256i w = iq4_levels(b.qs);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const Q8ActScale s = act_scale<kValues>(a[i], block, 0);
      const __m256 dot = _mm256_cvtepi32_ps(Dot::s8_s8(w, act_bytes<kValues>(a[i], block, 0)));
      acc[i] = _mm256_fmadd_ps(dot, _mm256_set1_ps(d * s.d), acc[i]);
    }
  }
};

// The sum of each of eight int32 vectors' lanes in kSubBlockOrder, as
// sum_sub_blocks but with 32-bit adds (hadd): IQ4 dots (4 * 127 * 127 per
// lane) do not fit the int16 packs.
static inline __m256i sum_sub_blocks32(const __m256i dot[8]) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(dot[0], dot[1]), _mm256_hadd_epi32(dot[4], dot[5]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(dot[2], dot[3]), _mm256_hadd_epi32(dot[6], dot[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// IQ4_XS: sub-block j adds d (ls_j - 32) dx_j dot_j; the eight dots summed
// across lanes (sum_sub_blocks32) and scaled with one multiply-add per token.
template <typename Dot>
struct LaneSumIQ4_XS {
  using Block = BlockIQ4_XS;
  static constexpr int kValues = kQK_K;
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc, float*) {
    __m256i q[8];  // q[j]: sub-block j's signed levels
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) q[j] = iq4_levels(b.qs + 16 * j);
    const __m256 scale = _mm256_mul_ps(
        _mm256_set1_ps(_cvtsh_ss(b.d)),
        _mm256_setr_ps(static_cast<float>(iq4_xs_scale(b, 0)), static_cast<float>(iq4_xs_scale(b, 1)),
                       static_cast<float>(iq4_xs_scale(b, 4)), static_cast<float>(iq4_xs_scale(b, 5)),
                       static_cast<float>(iq4_xs_scale(b, 2)), static_cast<float>(iq4_xs_scale(b, 3)),
                       static_cast<float>(iq4_xs_scale(b, 6)), static_cast<float>(iq4_xs_scale(b, 7))));
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      __m256i dot[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) dot[j] = Dot::s8_s8(q[j], act_bytes<kValues>(a[i], block, j));
      const ActSubScales x = act_sub_scales(a[i].scales + block * 8);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_sub_blocks32(dot)), _mm256_mul_ps(scale, x.d), acc[i]);
    }
  }
};

template <typename BlockT, int kBits, typename Dot>
struct LaneSumK {
  using Block = BlockT;
  static constexpr int kValues = kQK_K;
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc, float*) {
    __m256i q[8];  // q[j]: sub-block j's unsigned values
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) k_quant_chunk<BlockT, kBits>(b, k, q + 2 * k);
    const KSubScaleMins sm = k_scale_mins(b.scales);
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.d)), sm.scale);
    const __m256 min = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.dmin)), sm.min);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      __m256i dot[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) dot[j] = Dot::u8_s8(q[j], act_bytes<kValues>(a[i], block, j));
      const ActSubScales x = act_sub_scales(a[i].scales + block * 8);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_sub_blocks(dot)), _mm256_mul_ps(scale, x.d), acc[i]);
      acc[i] = _mm256_fnmadd_ps(min, x.s, acc[i]);
    }
  }
};

// The types of 16 sub-blocks of 16 values with signed 8-bit group scales:
// unpack(b, q) gives q[j] = values 32 j .. 32 j + 31, scales(b) the 16 group
// scales (int8), dot(q, a) the ISA's integer dot; Q2_K also subtracts
// dmin m_g sum(a)_g (kHasMins, mins(b) the 16 m_g).
template <typename Dot>
struct Q6Groups {
  using Block = BlockQ6_K;
  static constexpr bool kHasMins = false;
  static void unpack(const Block& b, __m256i q[8]) {  // unsigned 6-bit, dot subtracts 32
    q6_k_half(b, 0, q);
    q6_k_half(b, 1, q + 4);
  }
  static __m128i scales(const Block& b) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)); }
  static __m256i dot(__m256i q, __m256i a) { return Dot::q6(q, a); }
};
template <typename Dot>
struct Q3Groups {
  using Block = BlockQ3_K;
  static constexpr bool kHasMins = false;
  static void unpack(const Block& b, __m256i q[8]) {  // signed -4..3
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) q[j] = q3_k_values(b, j);
  }
  static __m128i scales(const Block& b) {
    alignas(16) int8_t s[16];
    for (int g = 0; g < 16; ++g) s[g] = static_cast<int8_t>(q3_k_scale(b.scales, g));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(s));
  }
  static __m256i dot(__m256i q, __m256i a) { return Dot::s8_s8(q, a); }
};
template <typename Dot>
struct Q2Groups {
  using Block = BlockQ2_K;
  static constexpr bool kHasMins = true;
  static void unpack(const Block& b, __m256i q[8]) {  // unsigned 0..3
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) q[j] = two_bit_values(b.qs, j);
  }
  static __m128i packed(const Block& b) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)); }
  static __m128i scales(const Block& b) { return _mm_and_si128(packed(b), _mm_set1_epi8(15)); }
  static __m128i mins(const Block& b) { return _mm_and_si128(_mm_srli_epi16(packed(b), 4), _mm_set1_epi8(15)); }
  static __m256i dot(__m256i q, __m256i a) { return Dot::u8_s8(q, a); }
};

// Per 32 values j, lanes 0..3 of the dot belong to 16-value group 2j and
// lanes 4..7 to group 2j + 1, each with its own 8-bit scale. Per token the
// groups' dots are summed across lanes into two vectors, [g0 g2 g4 g6 | g1
// g3 g5 g7] for j < 4 and likewise for groups 8..15, then scaled by
// d scale_g dx_j (Q2_K: minus dmin m_g dx_j times the same sums of a).
template <typename Groups>
struct LaneSumGroups16 {
  using Block = typename Groups::Block;
  static constexpr int kValues = kQK_K;
  // |lane| <= 4 * 32 * 127, as sum_sub_blocks needs.
  static __m256i sum_groups(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    return add_pairs(add_pairs(v0, v1), add_pairs(v2, v3));
  }
  // Sixteen int8 per-group factors times f, in the lane order of sum_groups.
  struct GroupFactors {
    __m256 first, second;
  };
  static GroupFactors group_factors(__m128i bytes, float f) {
    const __m128i ordered = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
    const __m256 factor = _mm256_set1_ps(f);
    return {_mm256_mul_ps(factor, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(ordered))),
            _mm256_mul_ps(factor, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(ordered, ordered))))};
  }
  // acc += sums of the eight 32-value dots, group-wise, times factors * dx.
  static __m256 add_scaled(const __m256i dot[8], const GroupFactors& f, __m256 dx_first, __m256 dx_second,
                           __m256 acc) {
    const __m256 first = _mm256_cvtepi32_ps(sum_groups(dot[0], dot[1], dot[2], dot[3]));
    const __m256 second = _mm256_cvtepi32_ps(sum_groups(dot[4], dot[5], dot[6], dot[7]));
    acc = _mm256_fmadd_ps(first, _mm256_mul_ps(f.first, dx_first), acc);
    return _mm256_fmadd_ps(second, _mm256_mul_ps(f.second, dx_second), acc);
  }
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc, float*) {
    __m256i q[8];
    Groups::unpack(b, q);
    const GroupFactors scales = group_factors(Groups::scales(b), _cvtsh_ss(b.d));
    GroupFactors mins{};
    if constexpr (Groups::kHasMins) mins = group_factors(Groups::mins(b), -_cvtsh_ss(b.dmin));
    // dx of activation blocks 0..3 (4..7) in both halves: every other float of four {d, s} pairs.
    const __m256i every_d = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      __m256i dot[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) dot[j] = Groups::dot(q[j], act_bytes<kValues>(a[i], block, j));
      const Q8ActScale* sc = a[i].scales + block * 8;
      const __m256 dx_first = _mm256_permutevar8x32_ps(_mm256_loadu_ps(&sc[0].d), every_d);
      const __m256 dx_second = _mm256_permutevar8x32_ps(_mm256_loadu_ps(&sc[4].d), every_d);
      acc[i] = add_scaled(dot, scales, dx_first, dx_second, acc[i]);
      if constexpr (Groups::kHasMins) {
        __m256i sums[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) sums[j] = Groups::dot(_mm256_set1_epi8(1), act_bytes<kValues>(a[i], block, j));
        acc[i] = add_scaled(sums, mins, dx_first, dx_second, acc[i]);
      }
    }
  }
};
template <typename Dot>
using LaneSumQ6_K = LaneSumGroups16<Q6Groups<Dot>>;
template <typename Dot>
using LaneSumQ3_K = LaneSumGroups16<Q3Groups<Dot>>;
template <typename Dot>
using LaneSumQ2_K = LaneSumGroups16<Q2Groups<Dot>>;

}  // namespace kquants_simd
}  // namespace kvserve
