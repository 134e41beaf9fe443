// AVX2 + FMA + F16C kernels: 8 floats or one 32-weight block per step.
// Quantized blocks use maddubs (u8 x s8 -> s16 pairs) then madd into s32;
// every product fits in s16 because one side is a nibble (<= 15) or, for Q8_0,
// |w| <= 128 against |x| <= 127 (2 * 128 * 127 < 32767).
#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
#include "kernels/exact_simd.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace {

float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct F32Load {
  using Storage = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
};
struct F16Load {
  using Storage = uint16_t;
  static __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};
struct BF16Load {
  using Storage = uint16_t;
  static __m256 load8(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

// Two accumulators per (row, token) hide the FMA latency when R * N is small.
template <typename Load>
struct FloatRowDot {
  using Storage = typename Load::Storage;
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const Storage* w[R];
    const float* x[N];
    __m256 acc0[R][N], acc1[R][N];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      w[r] = reinterpret_cast<const Storage*>(job.w + (first_row + r * row_step) * job.row_bytes);
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) acc0[r][i] = acc1[r][i] = _mm256_setzero_ps();
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) x[i] = job.x + (first_token + i) * job.cols;
    int64_t c = 0;
    for (; c + 16 <= job.cols; c += 16) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 w0 = Load::load8(w[r] + c), w1 = Load::load8(w[r] + c + 8);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          acc0[r][i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[i] + c), acc0[r][i]);
          acc1[r][i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[i] + c + 8), acc1[r][i]);
        }
      }
    }
    for (; c < job.cols; c += 8) {
      // Last partial group: zero-padded copies so the vector loads stay in bounds.
      const int64_t n = job.cols - c < 8 ? job.cols - c : 8;
      for (int r = 0; r < R; ++r) {
        Storage wpad[8] = {};
        std::memcpy(wpad, w[r] + c, static_cast<size_t>(n) * sizeof(Storage));
        const __m256 wv = Load::load8(wpad);
        for (int i = 0; i < N; ++i) {
          float xpad[8] = {};
          std::memcpy(xpad, x[i] + c, static_cast<size_t>(n) * sizeof(float));
          acc0[r][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xpad), acc0[r][i]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(_mm256_add_ps(acc0[r][i], acc1[r][i]));
  }
};

// 32 nibbles of one Q4 block as bytes 0..15, in element order (low nibbles are
// elements 0..15, high nibbles 16..31).
__m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// Sum of unsigned w[j] * signed a[j] over 32 bytes, as 8 int32 lanes -> float.
__m256 dot_u8_s8(__m256i w, __m256i a) {
  const __m256i pairs = _mm256_maddubs_epi16(w, a);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

__m256i load_act(const Q8ActRow& a, int64_t block) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(a.qs + block * 32));
}

// Weight scales of blocks b, b+1 as [d0, o0, d1, o1]: the dot scale and the
// offset (w = d * q + offset) of each, with offset = kOffsetFactor * o.
// Multiplied by the activation's [dx0, s0, dx1, s1] this gives both blocks'
// dot scales (elements 0, 2) and offset terms (elements 1, 3) at once.
__m128 fp16x4_to_f32(uint64_t packed) { return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(packed))); }

struct Q4_0Format {
  using Block = BlockQ4_0;
  static constexpr float kOffsetFactor = -8.0f;  // offset = -8 * d
  static __m128 pair_scales(const Block& b0, const Block& b1) {
    const uint64_t d0 = b0.d, d1 = b1.d;
    return fp16x4_to_f32(d0 | d0 << 16 | d1 << 32 | d1 << 48);
  }
};
struct Q4_1Format {
  using Block = BlockQ4_1;
  static constexpr float kOffsetFactor = 1.0f;  // offset = m
  static __m128 pair_scales(const Block& b0, const Block& b1) {
    const uint64_t d0 = b0.d, m0 = b0.m, d1 = b1.d, m1 = b1.m;
    return fp16x4_to_f32(d0 | m0 << 16 | d1 << 32 | m1 << 48);
  }
};

// Q4_0 and Q4_1, two blocks per step. [q0, q1] & 15 holds both blocks'
// elements 0..15 and [q0, q1] >> 4 their elements 16..31, matching the
// activations' Q8Order::NibblePairs; int32 lanes 0..3 then belong to block b
// and 4..7 to block b+1.
template <typename Format>
struct Q4RowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    using Block = typename Format::Block;
    const int64_t n_blocks = job.cols / 32;
    const __m256i scale_lanes = _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0);
    const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
    const Block* blocks[R];
    Q8ActRow a[N];
    __m256 acc[R][N];
    __m128 offsets[R][N];  // elements 1 and 3 collect offset * s
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) a[i] = q8_act_row(job, first_token + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) {
        acc[r][i] = _mm256_setzero_ps();
        offsets[r][i] = _mm_setzero_ps();
      }
    }
    int64_t b = 0;
    for (; b + 2 <= n_blocks; b += 2) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i both = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[r][b].qs))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[r][b + 1].qs)), 1);
        const __m256i lo = _mm256_and_si256(both, low_nibbles);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), low_nibbles);
        const __m128 wscales = Format::pair_scales(blocks[r][b], blocks[r][b + 1]);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          const int8_t* qx = a[i].qs + b * 32;
          const __m256i pairs = _mm256_add_epi16(  // <= 4 * 15 * 127: no overflow
              _mm256_maddubs_epi16(lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(qx))),
              _mm256_maddubs_epi16(hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(qx + 32))));
          const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
          const __m128 prod = _mm_mul_ps(wscales, _mm_load_ps(&a[i].scales[b].d));
          offsets[r][i] = _mm_add_ps(offsets[r][i], prod);
          const __m256 scale = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(prod), scale_lanes);
          acc[r][i] = _mm256_fmadd_ps(dot, scale, acc[r][i]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float tail[N] = {};
      if (b < n_blocks) add_single_block<N>(blocks[r][b], a, b, tail);
      for (int i = 0; i < N; ++i) {
        const __m128 o = offsets[r][i];
        const float offset_sum = _mm_cvtss_f32(_mm_shuffle_ps(o, o, 1)) + _mm_cvtss_f32(_mm_shuffle_ps(o, o, 3));
        out[r * N + i] = horizontal_sum(acc[r][i]) + Format::kOffsetFactor * offset_sum + tail[i];
      }
    }
  }

  // The last block of a row with an odd block count (stored plainly in the activations).
  template <int N>
  static void add_single_block(const typename Format::Block& blk, const Q8ActRow* a, int64_t b, float* tail) {
    const __m256i w = unpack_nibbles(blk.qs);
    alignas(16) float wscales[4];
    _mm_store_ps(wscales, Format::pair_scales(blk, blk));
    for (int i = 0; i < N; ++i) {
      const Q8ActScale s = a[i].scales[b];
      tail[i] = wscales[0] * s.d * horizontal_sum(dot_u8_s8(w, load_act(a[i], b))) +
                Format::kOffsetFactor * wscales[1] * s.s;
    }
  }
};

// Signed x signed: maddubs wants one unsigned side, so multiply |w| by x
// carrying w's sign.
struct Q8_0RowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const BlockQ8_0* blocks[R];
    Q8ActRow a[N];
    __m256 acc[R][N];
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) a[i] = q8_act_row(job, first_token + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const BlockQ8_0*>(job.w + (first_row + r * row_step) * job.row_bytes);
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) acc[r][i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < job.cols / 32; ++b) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[r][b].qs));
        const __m256i w_abs = _mm256_sign_epi8(w, w);
        const float dw = _cvtsh_ss(blocks[r][b].d);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          const __m256i x_signed = _mm256_sign_epi8(load_act(a[i], b), w);
          const __m256 scale = _mm256_set1_ps(dw * a[i].scales[b].d);
          acc[r][i] = _mm256_fmadd_ps(dot_u8_s8(w_abs, x_signed), scale, acc[r][i]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) out[r * N + i] = horizontal_sum(acc[r][i]);
  }
};

// f32 activations. A block's weights are w = d * q + offset with small
// integers q, so it contributes d * sum(q * x) + offset * sum(x): q is widened
// to exact floats, the block dot sum(q * x) is scaled by d once, and the
// offset multiplies the block sum of x that matmul() computed once per call.
// That saves the per-weight dequantizing FMA (w = d * q + offset) of the
// plain form; rounding differs from dequantize-then-dot only by float
// summation order (plus offset * sum(x) cancelling part of d * sum(q * x)).

// The 32 nibbles of a Q4 block as exact floats in element order: zero-extended
// bytes hold a low nibble (elements 0..15) and a high nibble (16..31).
void widen_nibbles_exact(const uint8_t* qs, __m256 q[4]) {
  const __m256i bytes0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i bytes8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  const __m256i low = _mm256_set1_epi32(0x0f);
  q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes0, low));
  q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes8, low));
  q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes0, 4));  // a byte >> 4 is its high nibble
  q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes8, 4));
}

// Each format: widen(block, q) and scales(block) = [d, offset, 0, 0].
struct ExactQ4_0 {
  using Block = BlockQ4_0;
  static constexpr bool kHasOffset = true;
  static void widen(const Block& b, __m256 q[4]) { widen_nibbles_exact(b.qs, q); }
  static __m128 scales(const Block& b) {
    const uint64_t d = b.d;
    return _mm_mul_ps(fp16x4_to_f32(d | d << 16), _mm_setr_ps(1.0f, -8.0f, 0.0f, 0.0f));  // offset = -8 d
  }
};
struct ExactQ4_1 {
  using Block = BlockQ4_1;
  static constexpr bool kHasOffset = true;
  static void widen(const Block& b, __m256 q[4]) { widen_nibbles_exact(b.qs, q); }
  static __m128 scales(const Block& b) {
    const uint64_t d = b.d, m = b.m;
    return fp16x4_to_f32(d | m << 16);
  }
};
struct ExactQ8_0 {
  using Block = BlockQ8_0;
  static constexpr bool kHasOffset = false;
  static void widen(const Block& b, __m256 q[4]) {
    for (int k = 0; k < 4; ++k)
      q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * k))));
  }
  static __m128 scales(const Block& b) { return fp16x4_to_f32(b.d); }
};

// sum(q * x) over one 32-element block.
__m256 block_dot_exact(const __m256 q[4], const float* x) {
  __m256 s = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), s);
}

template <typename Format>
struct ExactRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    using Block = typename Format::Block;
    const int64_t n_blocks = job.cols / 32;
    const Block* blocks[R];
    const float* x[N];
    const float* x_sums[N];
    __m256 acc[R][N];
    __m128 offsets[R][N];  // lane 1 collects offset * sum(x)
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) {
      x[i] = job.x + (first_token + i) * job.cols;
      x_sums[i] = job.x_block_sums + (first_token + i) * x_block_sum_floats(job.cols);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      blocks[r] = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
#pragma GCC unroll 4
      for (int i = 0; i < N; ++i) {
        acc[r][i] = _mm256_setzero_ps();
        offsets[r][i] = _mm_setzero_ps();
      }
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        __m256 q[4];
        Format::widen(blocks[r][b], q);
        const __m128 scales = Format::scales(blocks[r][b]);
        const __m256 d = _mm256_broadcastss_ps(scales);
#pragma GCC unroll 4
        for (int i = 0; i < N; ++i) {
          acc[r][i] = _mm256_fmadd_ps(block_dot_exact(q, x[i] + b * 32), d, acc[r][i]);
          if constexpr (Format::kHasOffset) {
            const __m128 sum_pair = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x_sums[i] + 2 * b)));
            offsets[r][i] = _mm_fmadd_ps(scales, sum_pair, offsets[r][i]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i)
        out[r * N + i] = horizontal_sum(acc[r][i]) + _mm_cvtss_f32(_mm_movehdup_ps(offsets[r][i]));
  }
};

using exact_dq::exact_kernel;
template <typename Format>
using Many = exact_dq::DequantRowDot<Format, exact_dq::kRegsAvx2>;

}  // namespace

const KernelTable& avx2_kernel_table() {
  static const KernelTable table = {
    Isa::Avx2,
    run_row_tiles<FloatRowDot<F32Load>>,
    run_row_tiles<FloatRowDot<F16Load>>,
    run_row_tiles<FloatRowDot<BF16Load>>,
    run_row_tiles<Q4RowDot<Q4_0Format>>,
    run_row_tiles<Q4RowDot<Q4_1Format>>,
    run_row_tiles<Q8_0RowDot>,
    exact_kernel<ExactRowDot<ExactQ4_0>, Many<exact_dq::DqQ4_0>>,
    exact_kernel<ExactRowDot<ExactQ4_1>, Many<exact_dq::DqQ4_1>>,
    exact_kernel<ExactRowDot<ExactQ8_0>, Many<exact_dq::DqQ8_0>>,
    avx2_kquant_kernels(),
  };
  return table;
}

}  // namespace kvserve
