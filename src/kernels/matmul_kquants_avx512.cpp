// AVX-512 VNNI kernels for Q5_0 and the K-quants with 8-bit activations:
// vpdpbusd (u8 x s8, four products summed per int32 lane, no s16
// intermediate) replaces AVX2's maddubs + madd. 256-bit registers, as for
// the other Q4 types (faster than 512-bit on Zen 4, see docs/kernels.md).
// f32 activations: exact_simd.h with 32 registers for several tokens (and
// one, for Q5_0 and Q6_K), else the AVX2 kernels (FMA-bound; 512-bit gains
// nothing here).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (see matmul_avx512.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <type_traits>

#include "core/dtype.h"
#include "kernels/exact_simd.h"
#include "kernels/kernel_table.h"
#include "kernels/kquants_simd.h"

namespace kvserve {
namespace {

using namespace kquants_simd;

__m256i dpbusd(__m256i w, __m256i a) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a); }

// Tokens per q8 call: 8 accumulators and 8 offsets fit the 32 registers
// beside one row's unpacked weights.
constexpr int kQ8Tokens = 8;

// Each q8_block<N> below unpacks one weight block (bits and scales) once
// and then loops over the N tokens; per token it does what the one-token
// kernel did, in the same order, so results do not depend on N.

// Q5_0: w = d q - 16 d, q <= 31 unsigned.
struct VnniQ5_0 {
  using Block = BlockQ5_0;
  static constexpr int kValues = kQK4_0;
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc,
                                              float* offset) {
    const float d = _cvtsh_ss(b.d);
    const __m256i q = q5_0_bytes(b);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const Q8ActScale s = act_scale<kValues>(a[i], block, 0);
      const __m256 dot = _mm256_cvtepi32_ps(dpbusd(q, act_bytes<kValues>(a[i], block, 0)));
      acc[i] = _mm256_fmadd_ps(dot, _mm256_set1_ps(d * s.d), acc[i]);
      offset[i] -= 16.0f * d * s.s;
    }
  }
};

// Q4_K / Q5_K: sub-block j adds d sc_j dx_j dot_j - dmin m_j s_j. Per
// token the eight sub-block dots are summed across lanes into one vector
// (lane per sub-block), scaled by d sc dx and offset by dmin m s in two
// multiply-adds.
template <typename BlockT, int kBits>
struct VnniK {
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
      for (int j = 0; j < 8; ++j) dot[j] = dpbusd(q[j], act_bytes<kValues>(a[i], block, j));
      const ActSubScales x = act_sub_scales(a[i].scales + block * 8);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_sub_blocks(dot)), _mm256_mul_ps(scale, x.d), acc[i]);
      acc[i] = _mm256_fnmadd_ps(min, x.s, acc[i]);
    }
  }
};

// Q6_K: per 32 values j, dot(q, qx) - dot(32, qx) as int32 lanes 0..3
// (16-value group 2j) and 4..7 (group 2j + 1). Per token the groups' dots
// are summed across lanes into two vectors, [g0 g2 g4 g6 | g1 g3 g5 g7] for
// j < 4 and likewise for groups 8..15, then scaled by d scale_g dx_j.
struct VnniQ6_K {
  using Block = BlockQ6_K;
  static constexpr int kValues = kQK_K;
  // Lanes [g0 g2 g4 g6 | g1 g3 g5 g7] of 8 groups: even groups of values
  // 0..15, odd of 16..31 (|lane| <= 4 * 32 * 127, see sum_sub_blocks).
  static __m256i sum_groups(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    return add_pairs(add_pairs(v0, v1), add_pairs(v2, v3));
  }
  template <int N>
  [[gnu::always_inline]] static void q8_block(const Block& b, const Q8ActRow* a, int64_t block, __m256* acc, float*) {
    __m256i q[8];  // q[j]: values 32 j .. 32 j + 31, unsigned 6-bit
    q6_k_half(b, 0, q);
    q6_k_half(b, 1, q + 4);
    // d * scales[g] in the lane order of sum_groups.
    const __m128i scales = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)),
                                            _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d));
    const __m256 first_scales = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scales)));
    const __m256 second_scales =
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(scales, scales))));
    const __m256i bias = _mm256_set1_epi8(32);
    // dx of activation blocks 0..3 (4..7) in both halves: every other float of four {d, s} pairs.
    const __m256i every_d = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      __m256i dot[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i x = act_bytes<kValues>(a[i], block, j);
        dot[j] = _mm256_sub_epi32(dpbusd(q[j], x), dpbusd(bias, x));
      }
      const Q8ActScale* sc = a[i].scales + block * 8;
      const __m256 dx_first = _mm256_permutevar8x32_ps(_mm256_loadu_ps(&sc[0].d), every_d);
      const __m256 dx_second = _mm256_permutevar8x32_ps(_mm256_loadu_ps(&sc[4].d), every_d);
      const __m256 first = _mm256_cvtepi32_ps(sum_groups(dot[0], dot[1], dot[2], dot[3]));
      const __m256 second = _mm256_cvtepi32_ps(sum_groups(dot[4], dot[5], dot[6], dot[7]));
      acc[i] = _mm256_fmadd_ps(first, _mm256_mul_ps(first_scales, dx_first), acc[i]);
      acc[i] = _mm256_fmadd_ps(second, _mm256_mul_ps(second_scales, dx_second), acc[i]);
    }
  }
};

// f32 activations: DequantRowDot (exact_simd.h) with this file's 32
// registers for several tokens, and for one token where it beats the AVX2
// one-token kernel: Q6_K (1.34 vs 2.24 ms on 1536x8960: 4 rows x 2
// accumulators, no per-16-value scaling FMA per token) and Q5_0 (0.085 vs
// 0.120 ms on 1536x576). Q4_K / Q5_K keep the offset-form one-token kernel
// (1.30 vs 1.46 ms on 8960x1536).
template <typename Format, QuantKernels KQuantKernels::*kType>
void exact_kernel(const MatmulJob& job, int64_t row_begin, int64_t row_end) {
  constexpr bool kDequantOneToken =
      std::is_same_v<Format, exact_dq::DqQ6_K> || std::is_same_v<Format, exact_dq::DqQ5_0>;
  // Q4_K / Q5_K: the offset form also for two tokens (see matmul_kquants_avx2.cpp).
  constexpr int64_t kAvx2UpTo = kDequantOneToken ? 0 : 2;
  if (job.n_tokens <= kAvx2UpTo) (avx2_kquant_kernels().*kType).exact(job, row_begin, row_end);
  else run_row_tiles<exact_dq::DequantRowDot<Format, exact_dq::kRegsAvx512>>(job, row_begin, row_end);
}

}  // namespace

const KQuantKernels& avx512_kquant_kernels() {
  static const KQuantKernels kernels = {
      {run_row_tiles<Q8RowDot<VnniQ5_0, kQ8Tokens>>, exact_kernel<exact_dq::DqQ5_0, &KQuantKernels::q5_0>},
      {run_row_tiles<Q8RowDot<VnniK<BlockQ4_K, 4>, kQ8Tokens>>, exact_kernel<exact_dq::DqK<BlockQ4_K, 4>, &KQuantKernels::q4_k>},
      {run_row_tiles<Q8RowDot<VnniK<BlockQ5_K, 5>, kQ8Tokens>>, exact_kernel<exact_dq::DqK<BlockQ5_K, 5>, &KQuantKernels::q5_k>},
      {run_row_tiles<Q8RowDot<VnniQ6_K, kQ8Tokens>>, exact_kernel<exact_dq::DqQ6_K, &KQuantKernels::q6_k>},
  };
  return kernels;
}

}  // namespace kvserve
