#pragma once
// Internal: the GEMM over repacked float weights (kernels/float_packed.h) as
// templates, instantiated by matmul_float_avx2.cpp and _avx512.cpp with their
// own instruction sets and register counts (hence every function is static).
//
// Micro-kernel: G row groups (8 rows each, one 256-bit register of weights per
// group and column) x N tokens. Per column k it loads G weight registers
// (f16 / bf16 widened exactly to f32), broadcasts each token's x[k] and does
// G x N FMAs into G x N accumulators that stay in registers: per token a
// weight costs 1/8 of an FMA and no horizontal sum, since each lane is one
// row's chain over k. The chain of a (row, token) never depends on G, N, the
// cache blocks or the thread split: that is the batch invariance, and why
// matmul_float_reference() matches bit for bit.
//
// Cache blocking (prefill): the tokens go in tiles whose activations over a
// K block fit in L2, the K block is sized so that the G groups' weights over
// it stay in L1 while every token tile's micro-tiles pass over them; partial
// sums go to y between K blocks (a store and reload changes no bit).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>

#include "kernels/float_packed_kernels.h"

namespace kvserve {
namespace float_gemm {

struct F32Lanes {
  static constexpr size_t kBytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};
struct F16Lanes {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};
struct BF16Lanes {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

template <typename F, int... I>
static inline void unroll_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
// f(0), f(1), ..., f(N - 1) with compile-time indices.
template <int N, typename F>
static inline void unroll(F&& f) {
  unroll_impl(f, std::make_integer_sequence<int, N>{});
}

// Row groups per micro-tile of n tokens with kRegs vector registers: G x n
// accumulators + G weights + one broadcast, at most kMaxGroups groups (more
// would be more DRAM streams than decode needs to hide the FMA latency).
template <int kRegs, int kMaxGroups>
constexpr int groups_for(int n) {
  return std::min(kMaxGroups, (kRegs - 1) / (n + 1));
}

// The 8 lanes of y for group g, token t: rows 8g .. 8g + valid - 1.
static inline float* y_at(const PackedJob& job, int64_t g, int64_t t) { return job.y + t * job.rows + 8 * g; }
static inline int64_t valid_rows(const PackedJob& job, int64_t g) { return std::min<int64_t>(8, job.rows - 8 * g); }

static inline __m256 load_partial_sums(const PackedJob& job, int64_t g, int64_t t) {
  const int64_t valid = valid_rows(job, g);
  if (valid == 8) return _mm256_loadu_ps(y_at(job, g, t));
  float lanes[8] = {};  // padding rows: their sums are never stored
  std::memcpy(lanes, y_at(job, g, t), sizeof(float) * static_cast<size_t>(valid));
  return _mm256_loadu_ps(lanes);
}
static inline void store_sums(const PackedJob& job, int64_t g, int64_t t, __m256 v) {
  const int64_t valid = valid_rows(job, g);
  if (valid == 8) return _mm256_storeu_ps(y_at(job, g, t), v);
  float lanes[8];
  _mm256_storeu_ps(lanes, v);
  std::memcpy(y_at(job, g, t), lanes, sizeof(float) * static_cast<size_t>(valid));
}

// Where a micro-tile reads its weights: row group g's column k is at
// w + (g - first_group) * group_bytes + (k - first_column) * 8 values.
// The packed matrix itself ({job.w, job.group_bytes, 0, 0}) or a block of it
// widened to f32 (convert_panel).
struct Panel {
  const uint8_t* w;
  size_t group_bytes;
  int64_t first_group, first_column;
};

// Groups [g, g + G) x tokens [t0, t0 + N) over columns [k0, k1): continues
// the chains stored in y (k0 > 0) or starts them at 0, and stores them back.
template <typename Lanes, int G, int N>
static void micro_tile(const PackedJob& job, const Panel& panel, int64_t g, int64_t t0, int64_t k0, int64_t k1) {
  __m256 acc[G][N];
  const uint8_t* w[G];
  const float* x[N];
  unroll<G>([&](auto i) {
    w[i] = panel.w + static_cast<size_t>(g + i - panel.first_group) * panel.group_bytes +
           static_cast<size_t>(k0 - panel.first_column) * 8 * Lanes::kBytes;
    unroll<N>([&](auto t) { acc[i][t] = k0 == 0 ? _mm256_setzero_ps() : load_partial_sums(job, g + i, t0 + t); });
  });
  unroll<N>([&](auto t) {
    x[t] = reinterpret_cast<const float*>(job.xq + static_cast<size_t>(t0 + t) * job.xq_row_bytes) + k0;
  });
  const int64_t columns = k1 - k0;
  #pragma GCC unroll 2
  for (int64_t k = 0; k < columns; ++k) {
    __m256 wk[G];
    unroll<G>([&](auto i) { wk[i] = Lanes::load8(w[i] + static_cast<size_t>(k) * 8 * Lanes::kBytes); });
    unroll<N>([&](auto t) {
      const __m256 xk = _mm256_broadcast_ss(x[t] + k);
      unroll<G>([&](auto i) { acc[i][t] = _mm256_fmadd_ps(wk[i], xk, acc[i][t]); });
    });
  }
  unroll<G>([&](auto i) { unroll<N>([&](auto t) { store_sums(job, g + i, t0 + t, acc[i][t]); }); });
}

// Groups [g0, g1) x tokens [t0, t0 + n), n <= N, over [k0, k1): blocks of
// groups_for(n) groups, then the last groups one at a time.
template <typename Lanes, int kRegs, int kMaxGroups, int N>
static void tokens_n(const PackedJob& job, const Panel& panel, int64_t g0, int64_t g1, int64_t t0, int64_t n,
                     int64_t k0, int64_t k1) {
  if constexpr (N > 1) {
    if (n < N) return tokens_n<Lanes, kRegs, kMaxGroups, N - 1>(job, panel, g0, g1, t0, n, k0, k1);
  }
  constexpr int G = groups_for<kRegs, kMaxGroups>(N);
  int64_t g = g0;
  for (; g + G <= g1; g += G) micro_tile<Lanes, G, N>(job, panel, g, t0, k0, k1);
  for (; g < g1; ++g) micro_tile<Lanes, 1, N>(job, panel, g, t0, k0, k1);
}

// Groups [g0, g1) over columns [k0, k1) widened to f32 into `out` (the f32
// layout, (k1 - k0) x 8 floats per group): f16 / bf16 conversion done once per
// token tile instead of once per micro-tile (on Zen 1 vcvtph2ps beside 12 FMAs
// cost a quarter of the f16 GEMM's speed: 28 vs 35 GFLOP/s for f32).
template <typename Lanes>
static Panel convert_panel(const PackedJob& job, int64_t g0, int64_t g1, int64_t k0, int64_t k1, float* out) {
  const size_t columns = static_cast<size_t>(k1 - k0);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* src = job.w + static_cast<size_t>(g) * job.group_bytes + static_cast<size_t>(k0) * 8 * Lanes::kBytes;
    float* dst = out + static_cast<size_t>(g - g0) * columns * 8;
    for (size_t k = 0; k < columns; ++k) _mm256_storeu_ps(dst + 8 * k, Lanes::load8(src + k * 8 * Lanes::kBytes));
  }
  return {reinterpret_cast<const uint8_t*>(out), columns * 8 * sizeof(float), g0, k0};
}

// Row groups [g0, g1) for all tokens; kTokens per prefill micro-tile.
template <typename Lanes, int kRegs, int kMaxGroups, int kTokens>
static void float_rows(const PackedJob& job, int64_t g0, int64_t g1) {
  const int64_t n = job.n_tokens, cols = job.cols;
  const Panel packed{job.w, job.group_bytes, 0, 0};
  constexpr bool kWiden = Lanes::kBytes != sizeof(float);
  // Decode and small batches: one micro-tile of tokens reads each weight once,
  // so there is nothing to block for; f16 / bf16 widen in registers (through
  // a widened panel, 4 tokens measured 21 vs 23 GFLOP/s on Zen 1).
  if (n <= kTokens) return tokens_n<Lanes, kRegs, kMaxGroups, kTokens>(job, packed, g0, g1, 0, n, 0, cols);
  constexpr int G = groups_for<kRegs, kMaxGroups>(kTokens);
  constexpr size_t kPanelBytes = 24 * 1024;  // G groups' f32 weights over a K block: L1
  constexpr size_t kTileBytes = 256 * 1024;  // a token tile's activations over a K block: L2
  constexpr int64_t k_block = std::max<int64_t>(64, kPanelBytes / (G * 8 * sizeof(float)));
  const int64_t t_block = std::max<int64_t>(kTokens, static_cast<int64_t>(kTileBytes / (4 * k_block)) / kTokens * kTokens);
  // On the stack, not in a std::vector: a library template instantiated in
  // this translation unit may be compiled with AVX-512 and be the copy the
  // linker keeps for every other caller (see kernel_table.h).
  alignas(32) float widened[kWiden ? G * 8 * k_block : 1];
  for (int64_t t0 = 0; t0 < n; t0 += t_block) {
    const int64_t t1 = std::min(n, t0 + t_block);
    for (int64_t k0 = 0; k0 < cols; k0 += k_block) {
      const int64_t k1 = std::min(cols, k0 + k_block);
      for (int64_t g = g0; g < g1; g += G) {
        const int64_t g_end = std::min(g1, g + G);
        if constexpr (kWiden) {
          const Panel panel = convert_panel<Lanes>(job, g, g_end, k0, k1, widened);
          for (int64_t t = t0; t < t1; t += kTokens)
            tokens_n<F32Lanes, kRegs, kMaxGroups, kTokens>(job, panel, g, g_end, t, std::min<int64_t>(kTokens, t1 - t), k0, k1);
        } else {
          for (int64_t t = t0; t < t1; t += kTokens)
            tokens_n<Lanes, kRegs, kMaxGroups, kTokens>(job, packed, g, g_end, t, std::min<int64_t>(kTokens, t1 - t), k0, k1);
        }
      }
    }
  }
}

template <int kRegs, int kMaxGroups, int kTokens>
static FloatPackedKernels make_float_packed_kernels() {
  return {float_rows<F32Lanes, kRegs, kMaxGroups, kTokens>, float_rows<F16Lanes, kRegs, kMaxGroups, kTokens>,
          float_rows<BF16Lanes, kRegs, kMaxGroups, kTokens>};
}

}  // namespace float_gemm
}  // namespace kvserve
