#pragma once
// Internal to src/kernels: the f32-activation ("exact") kernels for several
// tokens at once (speculative verification passes of 2..9 tokens, prefill),
// for every block type. Included by matmul_avx2.cpp and matmul_avx512.cpp:
// everything is in an unnamed namespace, so each translation unit gets its
// own copy compiled with its own instruction set (see kernel_table.h); the
// AVX-512 one has 32 vector registers, so it holds more rows x tokens of
// accumulators per call.
//
// Each weight block is dequantized once per call, 32 values at a time, into
// four 8-float vectors (w = scale * q + offset) that every token of the call
// multiply-adds against its activations: per token a weight costs one FMA,
// and the unpacking is shared by the N tokens. (The one-token kernels fold
// the offset as offset * sum(x) instead, which saves the dequantizing FMA
// when there is only one token to share it.)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/kquants_simd.h"

namespace kvserve {
namespace {
namespace exact_dq {

// Each format: scales(block) once per block (whatever per-block state
// dequant needs) and dequant(block, scales, s, w), the weights of values
// 32 s .. 32 s + 31 as four 8-float vectors, computed in registers from the
// block's own bytes. Every loop that fills w is unrolled: as a loop, w went
// through the stack, which made the kernel twice as slow.

// 32 signed bytes as four 8-float vectors, in element order.
static inline void bytes_to_floats(__m256i v, __m256 q[4]) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
}

// The 32 nibbles of a Q4 block: zero-extended bytes hold a low nibble
// (elements 0..15) and a high nibble (16..31).
static inline void nibbles_to_floats(const uint8_t* qs, __m256 q[4]) {
  const __m256i bytes0 = kquants_simd::widen8(qs), bytes8 = kquants_simd::widen8(qs + 8);
  const __m256i low = _mm256_set1_epi32(0x0f);
  q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes0, low));
  q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes8, low));
  q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes0, 4));
  q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes8, 4));
}

// d and the offset of a 32-value block, w = d q + offset.
struct ScaleOffset {
  __m256 d, offset;
};

struct DqQ4_0 {
  using Block = BlockQ4_0;
  using Scales = ScaleOffset;
  static constexpr int kValues = 32;
  static Scales scales(const Block& b) {
    const float d = _cvtsh_ss(b.d);
    return {_mm256_set1_ps(d), _mm256_set1_ps(-8.0f * d)};
  }
  static void dequant(const Block& b, const Scales& sc, int, __m256 w[4]) {
    nibbles_to_floats(b.qs, w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(w[k], sc.d, sc.offset);
  }
};

struct DqQ4_1 {
  using Block = BlockQ4_1;
  using Scales = ScaleOffset;
  static constexpr int kValues = 32;
  static Scales scales(const Block& b) { return {_mm256_set1_ps(_cvtsh_ss(b.d)), _mm256_set1_ps(_cvtsh_ss(b.m))}; }
  static void dequant(const Block& b, const Scales& sc, int, __m256 w[4]) {
    nibbles_to_floats(b.qs, w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(w[k], sc.d, sc.offset);
  }
};

struct DqQ8_0 {
  using Block = BlockQ8_0;
  using Scales = __m256;
  static constexpr int kValues = 32;
  static Scales scales(const Block& b) { return _mm256_set1_ps(_cvtsh_ss(b.d)); }
  static void dequant(const Block& b, const Scales& d, int, __m256 w[4]) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                               _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * k)))),
                           d);
  }
};

// Q5_0 (w = d q - 16 d) and Q5_1 (w = d q + m): kquants_simd::q5_offset.
template <typename BlockT>
struct DqQ5 {
  using Block = BlockT;
  using Scales = ScaleOffset;
  static constexpr int kValues = 32;
  static Scales scales(const Block& b) {
    return {_mm256_set1_ps(_cvtsh_ss(b.d)), _mm256_set1_ps(kquants_simd::q5_offset(b))};
  }
  static void dequant(const Block& b, const Scales& sc, int, __m256 w[4]) {
    bytes_to_floats(kquants_simd::q5_bytes(b), w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(w[k], sc.d, sc.offset);
  }
};
using DqQ5_0 = DqQ5<BlockQ5_0>;
using DqQ5_1 = DqQ5<BlockQ5_1>;

// IQ4_NL: w = d * level, the levels looked up in registers.
struct DqIQ4_NL {
  using Block = BlockIQ4_NL;
  using Scales = __m256;
  static constexpr int kValues = kQK4_NL;
  static Scales scales(const Block& b) { return _mm256_set1_ps(_cvtsh_ss(b.d)); }
  static void dequant(const Block& b, const Scales& d, int, __m256 w[4]) {
    bytes_to_floats(kquants_simd::iq4_levels(b.qs), w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(w[k], d);
  }
};

// IQ4_XS: sub-block s has w = d (ls_s - 32) level.
struct DqIQ4_XS {
  using Block = BlockIQ4_XS;
  struct Scales {
    float d;
    int8_t scale[8];  // ls - 32
  };
  static constexpr int kValues = kQK_K;
  static Scales scales(const Block& b) {
    Scales out{_cvtsh_ss(b.d), {}};
    for (int j = 0; j < 8; ++j) out.scale[j] = static_cast<int8_t>(iq4_xs_scale(b, j));
    return out;
  }
  static void dequant(const Block& b, const Scales& sc, int s, __m256 w[4]) {
    const __m256 dl = _mm256_set1_ps(sc.d * static_cast<float>(sc.scale[s]));
    bytes_to_floats(kquants_simd::iq4_levels(b.qs + 16 * s), w);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(w[k], dl);
  }
};

// Q4_K / Q5_K: sub-block s (32 values) has w = d sc_s q - dmin m_s; its
// values 32 s + l come from byte 32 (s / 2) + l of qs, low nibble for even
// s, high for odd (and, for Q5_K, bit s of qh[l]).
template <typename BlockT, int kBits>
struct DqK {
  using Block = BlockT;
  // Scalars: lane permutes of a scale vector held eight index constants in
  // registers, and the kernel spilled its dequantized weights.
  struct Scales {
    float d, neg_dmin;
    KScaleMin sm[8];
  };
  static constexpr int kValues = kQK_K;
  static Scales scales(const Block& b) {
    Scales out{_cvtsh_ss(b.d), -_cvtsh_ss(b.dmin), {}};
    for (int j = 0; j < 8; ++j) out.sm[j] = kquant_scale_min(b.scales, j);
    return out;
  }
  static void dequant(const Block& b, const Scales& sc, int s, __m256 w[4]) {
    const __m256 scale = _mm256_set1_ps(sc.d * static_cast<float>(sc.sm[s].scale));
    const __m256 offset = _mm256_set1_ps(sc.neg_dmin * static_cast<float>(sc.sm[s].min));
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m256i bytes = kquants_simd::widen8(b.qs + 32 * (s / 2) + 8 * p);
      __m256i q = s % 2 == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)) : _mm256_srli_epi32(bytes, 4);
      if constexpr (kBits == 5) {
        const __m256i h = _mm256_srli_epi32(kquants_simd::widen8(b.qh + 8 * p), s);
        q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)), 4));
      }
      w[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), scale, offset);
    }
  }
};

// Q6_K: w = d scales[v / 16] (q - 32). Sub-block s = 4h + g holds values
// 128h + 32g + l: the low 4 bits from ql[64h + 32(g % 2) + l] (low nibble
// for g < 2, high for g >= 2), the top 2 from bits 2g of qh[32h + l].
struct DqQ6_K {
  using Block = BlockQ6_K;
  using Scales = float;  // d (scalars, as for DqK)
  static constexpr int kValues = kQK_K;
  static Scales scales(const Block& b) { return _cvtsh_ss(b.d); }
  static void dequant(const Block& b, const Scales& d, int s, __m256 w[4]) {
    const int h = s / 4, g = s % 4;
    const __m256i ql = kquants_simd::load32(b.ql + 64 * h + 32 * (g % 2));
    const __m256i qh = kquants_simd::load32(b.qh + 32 * h);
    const __m256i low = kquants_simd::mask_bytes(g < 2 ? ql : _mm256_srli_epi16(ql, 4), 0x0f);
    const __m256i top = g == 0   ? _mm256_slli_epi16(qh, 4)
                        : g == 1 ? _mm256_slli_epi16(qh, 2)
                        : g == 2 ? qh
                                 : _mm256_srli_epi16(qh, 2);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, kquants_simd::mask_bytes(top, 0x30)), _mm256_set1_epi8(32));
    bytes_to_floats(q, w);
    const __m256 first = _mm256_set1_ps(d * static_cast<float>(b.scales[2 * s]));
    const __m256 second = _mm256_set1_ps(d * static_cast<float>(b.scales[2 * s + 1]));
    w[0] = _mm256_mul_ps(w[0], first);
    w[1] = _mm256_mul_ps(w[1], first);
    w[2] = _mm256_mul_ps(w[2], second);
    w[3] = _mm256_mul_ps(w[3], second);
  }
};

// Q3_K: sub-block s (32 values) spans groups 2s, 2s + 1, w = d (sc_g - 32) q
// with q in -4..3.
struct DqQ3_K {
  using Block = BlockQ3_K;
  struct Scales {
    float d;
    int8_t scale[16];  // sc_g - 32
  };
  static constexpr int kValues = kQK_K;
  static Scales scales(const Block& b) {
    Scales out{_cvtsh_ss(b.d), {}};
    for (int g = 0; g < 16; ++g) out.scale[g] = static_cast<int8_t>(q3_k_scale(b.scales, g));
    return out;
  }
  static void dequant(const Block& b, const Scales& sc, int s, __m256 w[4]) {
    bytes_to_floats(kquants_simd::q3_k_values(b, s), w);
    const __m256 first = _mm256_set1_ps(sc.d * static_cast<float>(sc.scale[2 * s]));
    const __m256 second = _mm256_set1_ps(sc.d * static_cast<float>(sc.scale[2 * s + 1]));
    w[0] = _mm256_mul_ps(w[0], first);
    w[1] = _mm256_mul_ps(w[1], first);
    w[2] = _mm256_mul_ps(w[2], second);
    w[3] = _mm256_mul_ps(w[3], second);
  }
};

// Q2_K: group g has w = d (sc_g & 15) q - dmin (sc_g >> 4), q in 0..3.
struct DqQ2_K {
  using Block = BlockQ2_K;
  struct Scales {
    float d, dmin;
  };
  static constexpr int kValues = kQK_K;
  static Scales scales(const Block& b) { return {_cvtsh_ss(b.d), _cvtsh_ss(b.dmin)}; }
  static void dequant(const Block& b, const Scales& sc, int s, __m256 w[4]) {
    bytes_to_floats(kquants_simd::two_bit_values(b.qs, s), w);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const uint8_t packed = b.scales[2 * s + half];
      const __m256 dl = _mm256_set1_ps(sc.d * static_cast<float>(packed & 15));
      const __m256 ml = _mm256_set1_ps(sc.dmin * static_cast<float>(packed >> 4));
      w[2 * half] = _mm256_fmsub_ps(w[2 * half], dl, ml);
      w[2 * half + 1] = _mm256_fmsub_ps(w[2 * half + 1], dl, ml);
    }
  }
};

static inline float horizontal_sum(__m256 v) { return kquants_simd::horizontal_sum(v); }

// R rows x N tokens in kRegs vector registers (16 for AVX2, 32 for AVX-512).
// Per 32 values the R rows' weights are dequantized (4 R vectors), then each
// activation vector is loaded once and multiplied into all R rows: an FMA
// needs 1 / R loads. That matters once the N tokens' activations outgrow L1
// (8 tokens of 1536 columns are 48 KiB) and come from L2 at half the rate the
// FMAs want. registers_needed() keeps weights, accumulators and the
// activation vector within the register file (spilled accumulators made a
// K-quant pass twice as slow).
template <typename Format, int kRegs>
struct DequantRowDot {
  static constexpr int kMaxTokens = kMaxTokensPerPass;
  // One row reads its activations straight into the FMAs (no register).
  static constexpr int registers_needed(int rows, int n, bool split) {
    return 4 * rows + rows * n * (split ? 2 : 1) + (rows > 1 ? 1 : 0);
  }
  // Left for constants and temporaries: 4 of AVX2's 16 (so that 3 and 4
  // tokens still get split chains: 3 chains of 4 dependent FMAs per 32
  // values made AVX2's 3-token SmolLM2 pass 16% slower than main's), 6 of 32.
  static constexpr int kFree = kRegs == 16 ? 12 : kRegs - 6;
  static constexpr int rows_for(int n) {
    for (int rows : {4, 2})
      if (registers_needed(rows, n, false) <= kFree) return rows;
    return 1;
  }

  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    using Block = typename Format::Block;
    constexpr int V = Format::kValues;
    // Two accumulators per (row, token) where the registers allow: few
    // chains cannot cover the FMA latency.
    constexpr bool kSplit = registers_needed(R, N, true) <= kFree;
    const int64_t n_blocks = job.cols / V;
    const Block* blocks[R];
    const float* x[N];
    __m256 acc[2][R][N];  // [k % 2] when split, else [0]
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) x[i] = job.x + (first_token + i) * job.cols;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
#pragma GCC unroll 8
      for (int i = 0; i < N; ++i) acc[0][r][i] = acc[1][r][i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
      typename Format::Scales sc[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) sc[r] = Format::scales(blocks[r][b]);
      // Unrolled so that the sub-block index is a constant in dequant.
#pragma GCC unroll 8
      for (int s = 0; s < V / 32; ++s) {
        __m256 w[R][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) Format::dequant(blocks[r][b], sc[r], s, w[r]);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          constexpr int kHalves = kSplit ? 2 : 1;
#pragma GCC unroll 8
          for (int i = 0; i < N; ++i) {
            const __m256 xv = _mm256_loadu_ps(x[i] + b * V + 32 * s + 8 * k);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) acc[k % kHalves][r][i] = _mm256_fmadd_ps(w[r][k], xv, acc[k % kHalves][r][i]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i)
        out[r * N + i] = horizontal_sum(kSplit ? _mm256_add_ps(acc[0][r][i], acc[1][r][i]) : acc[0][r][i]);
  }
};

// Vector registers: AVX2 has 16, AVX-512 (VL) 32.
constexpr int kRegsAvx2 = 16;
constexpr int kRegsAvx512 = 32;

// f32 activations: the one-token kernel One for decode (and up to
// kOneUpTo tokens), the dequantizing Many (a DequantRowDot) for more.
template <typename One, typename Many, int kOneUpTo = 1>
void exact_kernel(const MatmulJob& job, int64_t row_begin, int64_t row_end) {
  if (job.n_tokens <= kOneUpTo) run_row_tiles<One>(job, row_begin, row_end);
  else run_row_tiles<Many>(job, row_begin, row_end);
}

}  // namespace exact_dq
}  // namespace
}  // namespace kvserve
