// AVX2 + FMA + F16C kernels for Q5_0, Q5_1, IQ4_NL, IQ4_XS and the K-quants (Q2_K..Q6_K).
//
// f32 activations (the scalar reference dequantizes, then dots; these differ
// from it only in float rounding and summation order):
//  - Q4_K / Q5_K: offset form, d sc_j sum(q x) - dmin m_j sum(x_j), with q
//    widened to exact floats and sum(x_j) from job.x_block_sums;
//  - Q6_K: sum((q - 32) x) per 16-value scale group, times d * scale;
//  - Q5_0 / Q5_1: the block dequantized in registers (d q - 16 d, d q + m), then
//    FMA'd with x; IQ4_NL / IQ4_XS likewise (d level, d (ls - 32) level,
//    levels by byte shuffle), one token or many (DequantRowDot).
//
// 8-bit activations (Q8Order::Plain, blocks of 32): per 32 values an exact
// integer dot (maddubs u8 x s8 -> s16 pairs, madd -> s32); the K-quants sum
// a block's dots across lanes and scale them in float (LaneSumK /
// LaneSumQ6_K in kquants_simd.h), Q5_0 / Q5_1 scale each dot by d * dx. Every s16
// intermediate is bounded below 32767 (see each format).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/exact_simd.h"
#include "kernels/kernel_table.h"
#include "kernels/kquants_simd.h"

namespace kvserve {
namespace {

using namespace kquants_simd;

// Q4_K / Q5_K sub-block scales as floats: d * sc[j] and dmin * m[j], j < 8.
struct KSubScales {
  alignas(32) float scale[8];
  alignas(32) float min[8];
};
// Always inlined: as a call it spilled the kernel's vector registers per block.
template <typename Block>
[[gnu::always_inline]] inline KSubScales k_sub_scales(const Block& b) {
  alignas(8) uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    const KScaleMin sm = kquant_scale_min(b.scales, j);
    sc[j] = sm.scale;
    m[j] = sm.min;
  }
  KSubScales out;
  _mm256_store_ps(out.scale, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.d)), _mm256_cvtepi32_ps(widen8(sc))));
  _mm256_store_ps(out.min, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.dmin)), _mm256_cvtepi32_ps(widen8(m))));
  return out;
}

// ---- f32 activations --------------------------------------------------------

// Q5_0 (w = d q - 16 d) and Q5_1 (w = d q + m).
template <typename BlockT>
struct ExactQ5 {
  using Block = BlockT;
  static constexpr int kValues = 32;
  static void dequantize(const Block& b, __m256* w) {
    alignas(32) uint8_t q[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), q5_bytes(b));
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b.d)), offset = _mm256_set1_ps(q5_offset(b));
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen8(q + 8 * k)), d, offset);
  }
};

// Bit `bit` of each int32 lane as 16 or 0 (a Q5_K fifth bit).
__m256i bit_as_16(__m256i lanes, int bit) {
  const __m256i one = _mm256_and_si256(_mm256_srl_epi32(lanes, _mm_cvtsi32_si128(bit)), _mm256_set1_epi32(1));
  return _mm256_slli_epi32(one, 4);
}

// Q6_K with f32 activations: value 128h + 32g + l is d * scales[(128h + 32g + l) / 16] * (q - 32).
// Per 16 values (one scale) a float dot of (q - 32) with x, scaled once.
struct Q6KRowDot {
  // q - 32 of values 128h + 32g + 8p .. + 7 (g = 0..3) as exact floats.
  static void unpack8(const BlockQ6_K& b, int h, int p, __m256 q[4]) {
    const __m256i low = _mm256_set1_epi32(0x0f), two = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    const __m256i a = widen8(b.ql + 64 * h + 8 * p), c = widen8(b.ql + 64 * h + 32 + 8 * p);
    const __m256i qh = widen8(b.qh + 32 * h + 8 * p);
    const __m256i top[4] = {_mm256_and_si256(qh, two), _mm256_and_si256(_mm256_srli_epi32(qh, 2), two),
                            _mm256_and_si256(_mm256_srli_epi32(qh, 4), two), _mm256_srli_epi32(qh, 6)};
    const __m256i bottom[4] = {_mm256_and_si256(a, low), _mm256_and_si256(c, low), _mm256_srli_epi32(a, 4),
                               _mm256_srli_epi32(c, 4)};
    for (int g = 0; g < 4; ++g)
      q[g] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(bottom[g], _mm256_slli_epi32(top[g], 4)), bias));
  }

  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const int64_t n_blocks = job.cols / kQK_K;
    const BlockQ6_K* blocks[R];
    const float* x[N];
    __m256 acc[R][N];
    for (int i = 0; i < N; ++i) x[i] = job.x + (first_token + i) * job.cols;
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const BlockQ6_K*>(job.w + (first_row + r * row_step) * job.row_bytes);
      for (int i = 0; i < N; ++i) acc[r][i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const BlockQ6_K& blk = blocks[r][b];
        const float d = _cvtsh_ss(blk.d);
        // Unrolled so that the unpacked q stay in registers.
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
          for (int m = 0; m < 2; ++m) {  // values l = 16m .. 16m + 15 of each group
            __m256 q0[4], q1[4];
            unpack8(blk, h, 2 * m, q0);
            unpack8(blk, h, 2 * m + 1, q1);
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g) {
              const __m256 scale = _mm256_set1_ps(d * static_cast<float>(blk.scales[8 * h + 2 * g + m]));
#pragma GCC unroll 4
              for (int i = 0; i < N; ++i) {
                const float* xg = x[i] + b * kQK_K + 128 * h + 32 * g + 16 * m;
                const __m256 dot =
                    _mm256_fmadd_ps(q1[g], _mm256_loadu_ps(xg + 8), _mm256_mul_ps(q0[g], _mm256_loadu_ps(xg)));
                acc[r][i] = _mm256_fmadd_ps(dot, scale, acc[r][i]);
              }
            }
          }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(acc[r][i]);
  }
};

template <typename Format>
struct ExactRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    using Block = typename Format::Block;
    constexpr int kVectors = Format::kValues / 8;
    const int64_t n_blocks = job.cols / Format::kValues;
    const Block* blocks[R];
    const float* x[N];
    __m256 acc0[R][N], acc1[R][N];
    for (int i = 0; i < N; ++i) x[i] = job.x + (first_token + i) * job.cols;
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
      for (int i = 0; i < N; ++i) acc0[r][i] = acc1[r][i] = _mm256_setzero_ps();
    }
    __m256 w[kVectors];
    for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        Format::dequantize(blocks[r][b], w);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          const float* xb = x[i] + b * Format::kValues;
          for (int k = 0; k < kVectors; k += 2) {
            acc0[r][i] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xb + 8 * k), acc0[r][i]);
            acc1[r][i] = _mm256_fmadd_ps(w[k + 1], _mm256_loadu_ps(xb + 8 * k + 8), acc1[r][i]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(_mm256_add_ps(acc0[r][i], acc1[r][i]));
  }
};

// Q4_K / Q5_K with f32 activations in the offset form: sub-block j adds
// d sc_j sum(q x) - dmin m_j sum(x_j), with sum(x_j) from job.x_block_sums
// ({0, sum} per 32 values), so a weight costs a widen and one FMA per token
// instead of a dequantizing FMA plus the dot's.
template <typename BlockT, int kBits>
struct KOffsetRowDot {
  // One row per call beyond one token: the 8 unpacked q vectors leave no
  // registers for a second row's accumulators (2 rows x 2 tokens: 1.69 vs
  // 1.50 ms on 8960x1536).
  static constexpr int rows_for(int n) { return n == 1 ? kRowsPerPass : 1; }
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const int64_t n_blocks = job.cols / kQK_K;
    const BlockT* blocks[R];
    const float* x[N];
    const float* sums[N];
    __m256 acc[R][N], offsets[R][N];  // offsets: odd lanes collect dmin m_j sum(x_j)
    for (int i = 0; i < N; ++i) {
      x[i] = job.x + (first_token + i) * job.cols;
      sums[i] = job.x_block_sums + (first_token + i) * x_block_sum_floats(job.cols);
    }
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const BlockT*>(job.w + (first_row + r * row_step) * job.row_bytes);
      for (int i = 0; i < N; ++i) acc[r][i] = offsets[r][i] = _mm256_setzero_ps();
    }
    const __m256i first_pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i second_pairs = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const BlockT& blk = blocks[r][b];
        const KSubScales s = k_sub_scales(blk);
        const __m256 mins = _mm256_load_ps(s.min);
        const __m256 min_lo = _mm256_permutevar8x32_ps(mins, first_pairs);
        const __m256 min_hi = _mm256_permutevar8x32_ps(mins, second_pairs);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          const float* pairs = sums[i] + 16 * b;
          offsets[r][i] = _mm256_fmadd_ps(min_lo, _mm256_loadu_ps(pairs), offsets[r][i]);
          offsets[r][i] = _mm256_fmadd_ps(min_hi, _mm256_loadu_ps(pairs + 8), offsets[r][i]);
        }
        // Unrolled so that q[] stays in registers (as a loop it went through the stack).
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          __m256 q[8];  // q[p]: values 64k + 8p .. (sub-block 2k); q[4 + p]: 64k + 32 + 8p .. (2k + 1)
#pragma GCC unroll 4
          for (int p = 0; p < 4; ++p) {
            const __m256i bytes = widen8(blk.qs + 32 * k + 8 * p);
            __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)), hi = _mm256_srli_epi32(bytes, 4);
            if constexpr (kBits == 5) {
              const __m256i h = widen8(blk.qh + 8 * p);
              lo = _mm256_or_si256(lo, bit_as_16(h, 2 * k));
              hi = _mm256_or_si256(hi, bit_as_16(h, 2 * k + 1));
            }
            q[p] = _mm256_cvtepi32_ps(lo);
            q[4 + p] = _mm256_cvtepi32_ps(hi);
          }
          const __m256 scale_lo = _mm256_set1_ps(s.scale[2 * k]), scale_hi = _mm256_set1_ps(s.scale[2 * k + 1]);
#pragma GCC unroll 4
          for (int i = 0; i < N; ++i) {
            const float* xk = x[i] + b * kQK_K + 64 * k;
            acc[r][i] = _mm256_fmadd_ps(dot32(q, xk), scale_lo, acc[r][i]);
            acc[r][i] = _mm256_fmadd_ps(dot32(q + 4, xk + 32), scale_hi, acc[r][i]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(acc[r][i]) - horizontal_sum(offsets[r][i]);
  }
  // sum(q[v] * x[8v ..]) over 32 values, as 8 lanes.
  static __m256 dot32(const __m256* q, const float* x) {
    __m256 d = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
    d = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), d);
    d = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), d);
    return _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), d);
  }
};

// ---- 8-bit activations (Q8RowDot in kquants_simd.h) ----------------------

// Each q8_block<N> unpacks one weight block once, then loops over the N
// tokens (see Q8RowDot).

// The integer dots of Q8Q5_0 / LaneSumK / LaneSumQ6_K (kquants_simd.h):
// maddubs pairs stay within int16 (<= 2 * 31 * 127 for Q5_0 / Q5_1 / Q4_K / Q5_K; for Q6_K each
// of q x and 32 x is <= 2 * 63 * 127, their difference <= 2 * 32 * 127).
struct Avx2Dot {
  static __m256i u8_s8(__m256i w, __m256i a) { return dot_u8_s8(w, a); }
  // Signed w (IQ4 levels): |w| times a with w's sign, pairs <= 2 * 127 * 127.
  static __m256i s8_s8(__m256i w, __m256i a) { return dot_u8_s8(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)); }
  static __m256i q6(__m256i q, __m256i a) {
    const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(_mm256_set1_epi8(32), a));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
};

// Tokens per q8 call: 4, the default of the 16-register kernels (not tuned
// for these).
constexpr int kQ8Tokens = 4;

// f32 activations: these one-token kernels for decode, the dequantizing
// DequantRowDot (exact_simd.h) for several tokens.
using exact_dq::exact_kernel;
template <typename Format>
using Many = exact_dq::DequantRowDot<Format, exact_dq::kRegsAvx2>;

constexpr KQuantKernels kAvx2KQuants = {
    {run_row_tiles<Q8RowDot<Q8Q5_0<Avx2Dot>, kQ8Tokens>>, exact_kernel<ExactRowDot<ExactQ5<BlockQ5_0>>, Many<exact_dq::DqQ5_0>>},
    {run_row_tiles<Q8RowDot<Q8Q5_1<Avx2Dot>, kQ8Tokens>>, exact_kernel<ExactRowDot<ExactQ5<BlockQ5_1>>, Many<exact_dq::DqQ5_1>>},
    {run_row_tiles<Q8RowDot<Q8IQ4_NL<Avx2Dot>, kQ8Tokens>>, run_row_tiles<Many<exact_dq::DqIQ4_NL>>},
    {run_row_tiles<Q8RowDot<LaneSumIQ4_XS<Avx2Dot>, kQ8Tokens>>, run_row_tiles<Many<exact_dq::DqIQ4_XS>>},
    {run_row_tiles<Q8RowDot<LaneSumQ2_K<Avx2Dot>, kQ8Tokens>>, run_row_tiles<Many<exact_dq::DqQ2_K>>},
    {run_row_tiles<Q8RowDot<LaneSumQ3_K<Avx2Dot>, kQ8Tokens>>, run_row_tiles<Many<exact_dq::DqQ3_K>>},
    // Q4_K / Q5_K: the offset form also for two tokens (1.50 vs 1.72 ms on 8960x1536).
    {run_row_tiles<Q8RowDot<LaneSumK<BlockQ4_K, 4, Avx2Dot>, kQ8Tokens>>,
     exact_kernel<KOffsetRowDot<BlockQ4_K, 4>, Many<exact_dq::DqK<BlockQ4_K, 4>>, 2>},
    {run_row_tiles<Q8RowDot<LaneSumK<BlockQ5_K, 5, Avx2Dot>, kQ8Tokens>>,
     exact_kernel<KOffsetRowDot<BlockQ5_K, 5>, Many<exact_dq::DqK<BlockQ5_K, 5>>, 2>},
    {run_row_tiles<Q8RowDot<LaneSumQ6_K<Avx2Dot>, kQ8Tokens>>, exact_kernel<Q6KRowDot, Many<exact_dq::DqQ6_K>>},
};

}  // namespace

const KQuantKernels& avx2_kquant_kernels() { return kAvx2KQuants; }

}  // namespace kvserve
