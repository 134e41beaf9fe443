// AVX-512 kernels (F, BW, VL, DQ, VNNI): vpdpbusd (u8 x s8, 4 products
// summed per int32 lane) does the integer dots of the quantized types, two
// 32-weight blocks per step; the block scales come in as one 4-float vector per
// step (see pair_scales), so their cost is shared by both blocks.
//
// Register width follows measurement on Zen 4, which executes 512-bit ops as
// two 256-bit halves: Q8_0 is fastest in 512-bit registers (one load per
// block, no unpacking), while Q4 blocks, which need unpacking, and the float
// types (pure FMA streams) run faster in 256-bit ones. So Q4 uses 256-bit VNNI
// and the float types reuse the AVX2 kernels.
// GCC 12's AVX-512 headers initialize their "undefined" vectors from
// themselves (`__m256d __Y = __Y;`), which -Wmaybe-uninitialized reports at
// every inlined use; the warning is about the header, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/exact_simd.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace {

float horizontal_sum(__m256 v) {
  __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h4 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h4, _mm_movehdup_ps(h4)));
}

float horizontal_sum(__m512 v) {
  return horizontal_sum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// ---- Quantized weights ---------------------------------------------------
//
// Every quantized type is written as w = dw * q + offset per block, with q
// unsigned bytes: Q4_1 has q = nibble and offset = m; Q4_0 has q = nibble and
// offset = -8 dw; Q8_0 has q = w + 128 (sign bit flipped) and offset = -128 dw.
// With activations x = dx * qx and s = dx * sum(qx), a block contributes
//   dw * dx * dot(q, qx) + offset * s.
// PairScales returns [dw0, o0, dw1, o1] for blocks b, b+1 (o = offset / k for
// a constant k folded in at the end), so one multiply by the activation's
// [dx0, s0, dx1, s1] gives both blocks' dot scales and offset terms.

__m128 fp16x4_to_f32(uint64_t packed) { return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(packed))); }

uint32_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint64_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two Q4 blocks' nibbles as [q0, q1] & 15 (elements 0..15 of both) and
// [q0, q1] >> 4 (elements 16..31), matching the activations'
// Q8Order::NibblePairs: int32 lanes 0..3 of a dot belong to block b, 4..7 to b+1.
struct NibblePair {
  __m256i lo, hi;
};
NibblePair unpack_nibble_pair(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i both = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
  const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  return {_mm256_and_si256(both, low_nibbles), _mm256_and_si256(_mm256_srli_epi16(both, 4), low_nibbles)};
}

// A single trailing block (odd block count): 32 unsigned q in a 256-bit vector.
__m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

struct Q4_0Format {
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_0);
  static constexpr float kOffsetFactor = -8.0f;  // offset = -8 * dw
  static __m128 pair_scales(const uint8_t* b0, const uint8_t* b1) {
    const uint64_t d0 = load_u16(b0), d1 = load_u16(b1);
    return fp16x4_to_f32(d0 | d0 << 16 | d1 << 32 | d1 << 48);
  }
  static NibblePair pair_q(const uint8_t* b0, const uint8_t* b1) { return unpack_nibble_pair(b0 + 2, b1 + 2); }
  static __m256i single_q(const uint8_t* b) { return unpack_nibbles(b + 2); }
};

struct Q4_1Format {
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_1);
  static constexpr float kOffsetFactor = 1.0f;  // offset = m, stored next to d
  static __m128 pair_scales(const uint8_t* b0, const uint8_t* b1) { return fp16x4_to_f32(load_u32(b0) | load_u32(b1) << 32); }
  static NibblePair pair_q(const uint8_t* b0, const uint8_t* b1) { return unpack_nibble_pair(b0 + 4, b1 + 4); }
  static __m256i single_q(const uint8_t* b) { return unpack_nibbles(b + 4); }
};

struct Q8_0Format {
  static constexpr size_t kBlockBytes = sizeof(BlockQ8_0);
  static constexpr float kOffsetFactor = -128.0f;  // offset = -128 * dw
  static __m128 pair_scales(const uint8_t* b0, const uint8_t* b1) { return Q4_0Format::pair_scales(b0, b1); }
  static __m512i pair_q(const uint8_t* b0, const uint8_t* b1) {
    const __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2)), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static __m256i single_q(const uint8_t* b) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

// One step's dot products for Q8_0: 512-bit, lanes 0..7 block b, 8..15 block b+1.
struct Wide {
  using Weights = __m512i;
  using Floats = __m512;
  static __m512 zero() { return _mm512_setzero_ps(); }
  static __m512i scale_lanes() { return _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0); }
  static __m512 spread(__m512i lanes, __m128 prod) { return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(prod)); }
  static __m512 dot(__m512i q, const int8_t* qx) {
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_load_si512(qx)));
  }
  static __m512 fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
};

// Q4_0 / Q4_1: 256-bit, two dpbusd (low and high nibbles) into one int32 sum.
struct Narrow {
  using Weights = NibblePair;
  using Floats = __m256;
  static __m256 zero() { return _mm256_setzero_ps(); }
  static __m256i scale_lanes() { return _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0); }
  static __m256 spread(__m256i lanes, __m128 prod) { return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(prod), lanes); }
  static __m256 dot(const NibblePair& q, const int8_t* qx) {
    __m256i sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q.lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(qx)));
    sum = _mm256_dpbusd_epi32(sum, q.hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(qx + 32)));
    return _mm256_cvtepi32_ps(sum);
  }
  static __m256 fmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
};

template <typename Format, typename Width>
struct QuantRowDot {
  // 32 registers hold 5 tokens' accumulators and offsets (and the GPRs their
  // activation pointers): 6..8 tokens in one call measured slower than two
  // groups (n = 6: 0.125 vs 0.114 ms on 1536x576).
  static constexpr int kMaxTokens = 5;
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    using Floats = typename Width::Floats;
    const int64_t n_blocks = job.cols / 32;
    const auto scale_lanes = Width::scale_lanes();
    const uint8_t* w[R];
    Q8ActRow a[N];
    Floats acc[R][N];
    __m128 offsets[R][N];  // elements 1 and 3 collect offset * s; 0 and 2 are unused
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) a[i] = q8_act_row(job, first_token + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      w[r] = job.w + (first_row + r * row_step) * job.row_bytes;
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) {
        acc[r][i] = Width::zero();
        offsets[r][i] = _mm_setzero_ps();
      }
    }
    int64_t b = 0;
    for (; b + 2 <= n_blocks; b += 2) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint8_t* b0 = w[r] + b * Format::kBlockBytes;
        const uint8_t* b1 = b0 + Format::kBlockBytes;
        const typename Width::Weights q = Format::pair_q(b0, b1);
        const __m128 wscales = Format::pair_scales(b0, b1);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          const __m128 prod = _mm_mul_ps(wscales, _mm_load_ps(&a[i].scales[b].d));
          offsets[r][i] = _mm_add_ps(offsets[r][i], prod);
          acc[r][i] = Width::fmadd(Width::dot(q, a[i].qs + b * 32), Width::spread(scale_lanes, prod), acc[r][i]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float tail[N] = {};
      if (b < n_blocks) add_single_block<N>(w[r] + b * Format::kBlockBytes, a, b, tail);
      for (int i = 0; i < N; ++i) {
        const __m128 o = offsets[r][i];
        const float offset_sum = _mm_cvtss_f32(_mm_shuffle_ps(o, o, 1)) + _mm_cvtss_f32(_mm_shuffle_ps(o, o, 3));
        out[r * N + i] = horizontal_sum(acc[r][i]) + Format::kOffsetFactor * offset_sum + tail[i];
      }
    }
  }
  // The last block of a row with an odd block count (stored plainly in the
  // activations), in 256-bit registers.
  template <int N>
  static void add_single_block(const uint8_t* blk, const Q8ActRow* a, int64_t b, float* tail) {
    const __m256i q = Format::single_q(blk);
    alignas(16) float wscales[4];
    _mm_store_ps(wscales, Format::pair_scales(blk, blk));
    for (int i = 0; i < N; ++i) {
      const __m256i qx = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].qs + b * 32));
      const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, qx);
      const __m128i half = _mm_add_epi32(_mm256_castsi256_si128(dot), _mm256_extracti128_si256(dot, 1));
      const __m128i quarter = _mm_add_epi32(half, _mm_unpackhi_epi64(half, half));
      const int32_t sum = _mm_cvtsi128_si32(quarter) + _mm_extract_epi32(quarter, 1);
      const Q8ActScale s = a[i].scales[b];
      tail[i] += wscales[0] * s.d * static_cast<float>(sum) + Format::kOffsetFactor * wscales[1] * s.s;
    }
  }
};

// f32 activations: DequantRowDot (exact_simd.h) with this file's 32
// registers for several tokens, and for one token where it is faster than
// the AVX2 table's one-token kernel (Q8_0: 0.051 vs 0.065 ms on 1536x576;
// Q4_0 and Q4_1, whose one-token kernel folds the offset as offset * sum(x),
// keep that kernel: 0.053 vs 0.057 ms).
template <typename Format, MatmulRowsFn KernelTable::*kOne>
void exact_kernel(const MatmulJob& job, int64_t row_begin, int64_t row_end) {
  constexpr bool kDequantOneToken = std::is_same_v<Format, exact_dq::DqQ8_0>;
  if (job.n_tokens == 1 && !kDequantOneToken) (avx2_kernel_table().*kOne)(job, row_begin, row_end);
  else run_row_tiles<exact_dq::DequantRowDot<Format, exact_dq::kRegsAvx512>>(job, row_begin, row_end);
}

}  // namespace

const KernelTable& avx512_kernel_table() {
  static const KernelTable table = {
      Isa::Avx512,
      avx2_kernel_table().f32,
      avx2_kernel_table().f16,
      avx2_kernel_table().bf16,
      run_row_tiles<QuantRowDot<Q4_0Format, Narrow>>,
      run_row_tiles<QuantRowDot<Q4_1Format, Narrow>>,
      run_row_tiles<QuantRowDot<Q8_0Format, Wide>>,
      exact_kernel<exact_dq::DqQ4_0, &KernelTable::q4_0_exact>,
      exact_kernel<exact_dq::DqQ4_1, &KernelTable::q4_1_exact>,
      exact_kernel<exact_dq::DqQ8_0, &KernelTable::q8_0_exact>,
      avx512_kquant_kernels(),
  };
  return table;
}

}  // namespace kvserve
