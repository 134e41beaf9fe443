// AVX2 + FMA + F16C kernels: 8 floats or one 32-weight block per step.
// Quantized blocks use maddubs (u8 x s8 -> s16 pairs) then madd into s32;
// every product fits in s16 because one side is a nibble (<= 15) or, for Q8_0,
// |w| <= 128 against |x| <= 127 (2 * 128 * 127 < 32767).
#include <immintrin.h>

#include <cstring>

#include "core/dtype.h"
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

// Two accumulators per token hide the FMA latency when N is small.
template <typename Load>
struct FloatRowDot {
  using Storage = typename Load::Storage;
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* w = reinterpret_cast<const Storage*>(job.w + row * job.row_bytes);
    const float* x[N];
    for (int i = 0; i < N; ++i) x[i] = job.x + (first_token + i) * job.cols;
    __m256 acc0[N], acc1[N];
    for (int i = 0; i < N; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= job.cols; c += 16) {
      const __m256 w0 = Load::load8(w + c), w1 = Load::load8(w + c + 8);
      for (int i = 0; i < N; ++i) {
        acc0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[i] + c), acc0[i]);
        acc1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[i] + c + 8), acc1[i]);
      }
    }
    for (; c < job.cols; c += 8) {
      // Last partial group: zero-padded copies so the vector load stays in bounds.
      const int64_t n = job.cols - c < 8 ? job.cols - c : 8;
      Storage wpad[8] = {};
      std::memcpy(wpad, w + c, static_cast<size_t>(n) * sizeof(Storage));
      const __m256 wv = Load::load8(wpad);
      for (int i = 0; i < N; ++i) {
        float xpad[8] = {};
        std::memcpy(xpad, x[i] + c, static_cast<size_t>(n) * sizeof(float));
        acc0[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xpad), acc0[i]);
      }
    }
    for (int i = 0; i < N; ++i) out[i] = horizontal_sum(_mm256_add_ps(acc0[i], acc1[i]));
  }
};

// 32 nibbles of a Q4 block as bytes 0..15, in element order (low nibbles are
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

// Q4_0 and Q4_1 share a loop: nibble q in 0..15, weight = d*q + offset, where
// offset is -8d (Q4_0) or m (Q4_1); per block sum = d*dx*dot(q, qx) + offset*s.
template <typename Block, bool kHasMin>
struct Q4RowDot {
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* blocks = reinterpret_cast<const Block*>(job.w + row * job.row_bytes);
    Q8ActRow a[N];
    __m256 acc[N];
    float offset_sum[N] = {};
    for (int i = 0; i < N; ++i) {
      a[i] = job.act(first_token + i);
      acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < job.cols / 32; ++b) {
      const __m256i w = unpack_nibbles(blocks[b].qs);
      const float dw = _cvtsh_ss(blocks[b].d);
      float offset = -8.0f * dw;
      if constexpr (kHasMin) offset = _cvtsh_ss(blocks[b].m);
      for (int i = 0; i < N; ++i) {
        const Q8ActScale s = a[i].scales[b];
        acc[i] = _mm256_fmadd_ps(dot_u8_s8(w, load_act(a[i], b)), _mm256_set1_ps(dw * s.d), acc[i]);
        offset_sum[i] += offset * s.s;
      }
    }
    for (int i = 0; i < N; ++i) out[i] = horizontal_sum(acc[i]) + offset_sum[i];
  }
};

// Signed x signed: maddubs wants one unsigned side, so multiply |w| by x
// carrying w's sign.
struct Q8_0RowDot {
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(job.w + row * job.row_bytes);
    Q8ActRow a[N];
    __m256 acc[N];
    for (int i = 0; i < N; ++i) {
      a[i] = job.act(first_token + i);
      acc[i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < job.cols / 32; ++b) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[b].qs));
      const __m256i w_abs = _mm256_sign_epi8(w, w);
      const float dw = _cvtsh_ss(blocks[b].d);
      for (int i = 0; i < N; ++i) {
        const __m256i x_signed = _mm256_sign_epi8(load_act(a[i], b), w);
        acc[i] = _mm256_fmadd_ps(dot_u8_s8(w_abs, x_signed), _mm256_set1_ps(dw * a[i].scales[b].d), acc[i]);
      }
    }
    for (int i = 0; i < N; ++i) out[i] = horizontal_sum(acc[i]);
  }
};

constexpr KernelTable kAvx2Table = {
    Isa::Avx2,
    run_row_tiles<FloatRowDot<F32Load>>,
    run_row_tiles<FloatRowDot<F16Load>>,
    run_row_tiles<FloatRowDot<BF16Load>>,
    run_row_tiles<Q4RowDot<BlockQ4_0, false>>,
    run_row_tiles<Q4RowDot<BlockQ4_1, true>>,
    run_row_tiles<Q8_0RowDot>,
};

}  // namespace

const KernelTable& avx2_kernel_table() { return kAvx2Table; }

}  // namespace kvserve
