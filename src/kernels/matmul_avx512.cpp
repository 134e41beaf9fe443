// AVX-512 kernels (F, BW, VL, DQ, VNNI). Quantized rows go two 32-weight
// blocks per 512-bit step, and vpdpbusd (u8 x s8, 4 products summed per int32
// lane) does the integer dot. The block scales come in as one 4-float vector
// per step (see pair_scales), so their cost is shared by both blocks.
// GCC 12's AVX-512 headers initialize their "undefined" vectors from
// themselves (`__m256d __Y = __Y;`), which -Wmaybe-uninitialized reports at
// every inlined use; the warning is about the header, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "core/dtype.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace {

float horizontal_sum(__m512 v) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  h4 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h4, _mm_movehdup_ps(h4)));
}

// ---- Float weights -------------------------------------------------------

struct F32Load {
  using Storage = float;
  static __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
struct F16Load {
  using Storage = uint16_t;
  static __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load16(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};
struct BF16Load {
  using Storage = uint16_t;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load16(const uint16_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load16(const uint16_t* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

// Two accumulators per token hide the FMA latency when N is small; the tail
// (cols % 16) uses masked loads. Token loops are unrolled so the
// accumulators stay in registers.
template <typename Load>
struct FloatRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const typename Load::Storage* w[R];
    const float* x[N];
    __m512 acc0[R][N], acc1[R][N];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      w[r] = reinterpret_cast<const typename Load::Storage*>(job.w + (first_row + r * row_step) * job.row_bytes);
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) acc0[r][i] = acc1[r][i] = _mm512_setzero_ps();
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) x[i] = job.x + (first_token + i) * job.cols;
    int64_t c = 0;
    for (; c + 32 <= job.cols; c += 32) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 w0 = Load::load16(w[r] + c), w1 = Load::load16(w[r] + c + 16);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          acc0[r][i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[i] + c), acc0[r][i]);
          acc1[r][i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[i] + c + 16), acc1[r][i]);
        }
      }
    }
    for (; c < job.cols; c += 16) {
      const int64_t n = job.cols - c < 16 ? job.cols - c : 16;
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      for (int r = 0; r < R; ++r) {
        const __m512 wv = Load::load16(w[r] + c, m);
        for (int i = 0; i < N; ++i) acc0[r][i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[i] + c), acc0[r][i]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(_mm512_add_ps(acc0[r][i], acc1[r][i]));
  }
};

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

// [q0, q1, q0 >> 4, q1 >> 4] & 15: blocks b and b+1 in the activations'
// Q8Order::NibblePairs, so int32 lanes 0..3 and 8..11 belong to block b.
__m512i unpack_nibble_pair(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i both = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(both), _mm256_srli_epi16(both, 4), 1);
  return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

// A single trailing block (odd block count): 32 unsigned q in a 256-bit vector.
__m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

struct Q4_0Format {
  // Which pair block (element 0: b, element 2: b+1) each int32 lane of the dot belongs to.
  static __m512i scale_lanes() { return _mm512_set_epi32(2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0); }
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_0);
  static constexpr float kOffsetFactor = -8.0f;  // offset = -8 * dw
  static __m128 pair_scales(const uint8_t* b0, const uint8_t* b1) {
    const uint64_t d0 = load_u16(b0), d1 = load_u16(b1);
    return fp16x4_to_f32(d0 | d0 << 16 | d1 << 32 | d1 << 48);
  }
  static __m512i pair_q(const uint8_t* b0, const uint8_t* b1) { return unpack_nibble_pair(b0 + 2, b1 + 2); }
  static __m256i single_q(const uint8_t* b) { return unpack_nibbles(b + 2); }
};

struct Q4_1Format {
  static __m512i scale_lanes() { return Q4_0Format::scale_lanes(); }
  static constexpr size_t kBlockBytes = sizeof(BlockQ4_1);
  static constexpr float kOffsetFactor = 1.0f;  // offset = m, stored next to d
  static __m128 pair_scales(const uint8_t* b0, const uint8_t* b1) { return fp16x4_to_f32(load_u32(b0) | load_u32(b1) << 32); }
  static __m512i pair_q(const uint8_t* b0, const uint8_t* b1) { return unpack_nibble_pair(b0 + 4, b1 + 4); }
  static __m256i single_q(const uint8_t* b) { return unpack_nibbles(b + 4); }
};

struct Q8_0Format {
  static __m512i scale_lanes() { return _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0); }
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

template <typename Format>
struct QuantRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const int64_t n_blocks = job.cols / 32;
    const __m512i scale_lanes = Format::scale_lanes();
    const uint8_t* w[R];
    Q8ActRow a[N];
    __m512 acc[R][N];
    __m128 offsets[R][N];  // elements 1 and 3 collect offset * s; 0 and 2 are unused
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) a[i] = q8_act_row(job, first_token + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      w[r] = job.w + (first_row + r * row_step) * job.row_bytes;
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) {
        acc[r][i] = _mm512_setzero_ps();
        offsets[r][i] = _mm_setzero_ps();
      }
    }
    int64_t b = 0;
    for (; b + 2 <= n_blocks; b += 2) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint8_t* b0 = w[r] + b * Format::kBlockBytes;
        const uint8_t* b1 = b0 + Format::kBlockBytes;
        const __m512i q = Format::pair_q(b0, b1);
        const __m128 wscales = Format::pair_scales(b0, b1);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          const __m128 prod = _mm_mul_ps(wscales, _mm_load_ps(&a[i].scales[b].d));
          offsets[r][i] = _mm_add_ps(offsets[r][i], prod);
          const __m512 scale = _mm512_permutexvar_ps(scale_lanes, _mm512_castps128_ps512(prod));
          const __m512i qx = _mm512_load_si512(a[i].qs + b * 32);
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, qx);
          acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][i]);
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

constexpr KernelTable kAvx512Table = {
    Isa::Avx512,
    run_row_tiles<FloatRowDot<F32Load>>,
    run_row_tiles<FloatRowDot<F16Load>>,
    run_row_tiles<FloatRowDot<BF16Load>>,
    run_row_tiles<QuantRowDot<Q4_0Format>>,
    run_row_tiles<QuantRowDot<Q4_1Format>>,
    run_row_tiles<QuantRowDot<Q8_0Format>>,
};

}  // namespace

const KernelTable& avx512_kernel_table() { return kAvx512Table; }

}  // namespace kvserve
