// AVX-512 VNNI kernels for Q5_0, Q5_1, IQ4_NL, IQ4_XS and the K-quants with 8-bit activations:
// vpdpbusd (u8 x s8, four products summed per int32 lane, no s16
// intermediate) replaces AVX2's maddubs + madd. 256-bit registers, as for
// the other Q4 types (faster than 512-bit on Zen 4, see docs/kernels.md).
// f32 activations: exact_simd.h with 32 registers for several tokens (and
// one, for Q5_0, Q5_1, the IQ4 types and Q6_K), else the AVX2 kernels (FMA-bound; 512-bit gains
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

// Tokens per q8 call: 8 tokens' accumulators fit the 32 registers beside a
// K-quant row's eight unpacked weight vectors.
constexpr int kQ8Tokens = 8;

// The integer dots of Q8Q5_0 / Q8Q5_1 / LaneSumK / LaneSumQ6_K (kquants_simd.h).
struct VnniDot {
  static __m256i u8_s8(__m256i w, __m256i a) { return dpbusd(w, a); }
  // Signed w (IQ4 levels): |w| times a with w's sign.
  static __m256i s8_s8(__m256i w, __m256i a) { return dpbusd(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w)); }
  static __m256i q6(__m256i q, __m256i a) { return _mm256_sub_epi32(dpbusd(q, a), dpbusd(_mm256_set1_epi8(32), a)); }
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
      std::is_same_v<Format, exact_dq::DqQ6_K> || std::is_same_v<Format, exact_dq::DqQ5_0> ||
      std::is_same_v<Format, exact_dq::DqQ5_1> || std::is_same_v<Format, exact_dq::DqIQ4_NL> ||
      std::is_same_v<Format, exact_dq::DqIQ4_XS> ||
      std::is_same_v<Format, exact_dq::DqQ2_K> || std::is_same_v<Format, exact_dq::DqQ3_K>;
  // Q4_K / Q5_K: the offset form also for two tokens (see matmul_kquants_avx2.cpp).
  constexpr int64_t kAvx2UpTo = kDequantOneToken ? 0 : 2;
  if (job.n_tokens <= kAvx2UpTo) (avx2_kquant_kernels().*kType).exact(job, row_begin, row_end);
  else run_row_tiles<exact_dq::DequantRowDot<Format, exact_dq::kRegsAvx512>>(job, row_begin, row_end);
}

}  // namespace

const KQuantKernels& avx512_kquant_kernels() {
  static const KQuantKernels kernels = {
      {run_row_tiles<Q8RowDot<Q8Q5_0<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqQ5_0, &KQuantKernels::q5_0>},
      {run_row_tiles<Q8RowDot<Q8Q5_1<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqQ5_1, &KQuantKernels::q5_1>},
      {run_row_tiles<Q8RowDot<Q8IQ4_NL<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqIQ4_NL, &KQuantKernels::iq4_nl>},
      {run_row_tiles<Q8RowDot<LaneSumIQ4_XS<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqIQ4_XS, &KQuantKernels::iq4_xs>},
      {run_row_tiles<Q8RowDot<LaneSumQ2_K<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqQ2_K, &KQuantKernels::q2_k>},
      {run_row_tiles<Q8RowDot<LaneSumQ3_K<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqQ3_K, &KQuantKernels::q3_k>},
      {run_row_tiles<Q8RowDot<LaneSumK<BlockQ4_K, 4, VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqK<BlockQ4_K, 4>, &KQuantKernels::q4_k>},
      {run_row_tiles<Q8RowDot<LaneSumK<BlockQ5_K, 5, VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqK<BlockQ5_K, 5>, &KQuantKernels::q5_k>},
      {run_row_tiles<Q8RowDot<LaneSumQ6_K<VnniDot>, kQ8Tokens>>, exact_kernel<exact_dq::DqQ6_K, &KQuantKernels::q6_k>},
  };
  return kernels;
}

}  // namespace kvserve
