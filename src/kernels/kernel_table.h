#pragma once
// Internal to src/kernels: the per-ISA kernel table and the data a matmul
// kernel works on. Included by the *_avx2.cpp / *_avx512.cpp translation
// units, so everything here is either a plain type or a template (a non-template
// inline function compiled with -mavx512f in one file could be the copy the
// linker keeps for every caller, and crash a CPU without AVX-512).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/dispatch.h"

namespace kvserve {

// Per-block scale of the 8-bit activations: x[j] ~= d * qs[j] and
// s = d * sum(qs) (the term that a weight offset or zero point multiplies).
struct Q8ActScale {
  float d;
  float s;
};

// One token's activations quantized to 8 bits in blocks of 32, the form the
// integer dot products of the Q4_0 / Q4_1 / Q8_0 kernels consume.
struct Q8ActRow {
  const int8_t* qs;         // cols values, 64-byte aligned
  const Q8ActScale* scales; // cols / 32 entries, 16-byte aligned
};

// Bytes one token's Q8ActRow takes in a buffer (qs, then scales), a multiple
// of 64 so consecutive tokens stay aligned.
constexpr size_t q8_act_row_bytes(int64_t cols) {
  const size_t qs_bytes = (static_cast<size_t>(cols) + 63) / 64 * 64;
  const size_t scale_bytes = static_cast<size_t>(cols / 32) * sizeof(Q8ActScale);
  return qs_bytes + (scale_bytes + 63) / 64 * 64;
}

// Everything one matmul call needs; kernels compute rows [row_begin, row_end).
struct MatmulJob {
  const uint8_t* w = nullptr;  // row-major weights, row_bytes apart
  size_t row_bytes = 0;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t n_tokens = 0;
  const float* x = nullptr;       // n_tokens x cols (float weight types)
  const uint8_t* xq = nullptr;    // n_tokens Q8ActRows of q8_act_row_bytes(cols) (quantized types)
  float* y = nullptr;             // n_tokens x rows

  Q8ActRow act(int64_t token) const {
    const uint8_t* base = xq + static_cast<size_t>(token) * q8_act_row_bytes(cols);
    const size_t qs_bytes = (static_cast<size_t>(cols) + 63) / 64 * 64;
    return {reinterpret_cast<const int8_t*>(base), reinterpret_cast<const Q8ActScale*>(base + qs_bytes)};
  }
};

using MatmulRowsFn = void (*)(const MatmulJob& job, int64_t row_begin, int64_t row_end);

struct KernelTable {
  Isa isa;
  MatmulRowsFn f32;
  MatmulRowsFn f16;
  MatmulRowsFn bf16;
  MatmulRowsFn q4_0;
  MatmulRowsFn q4_1;
  MatmulRowsFn q8_0;
};

const KernelTable& scalar_kernel_table();
#if KVSERVE_HAVE_SIMD
const KernelTable& avx2_kernel_table();
const KernelTable& avx512_kernel_table();
#endif
// The table matmul() uses (see dispatch.h).
const KernelTable& active_kernel_table();

// Quantizes one token's activations x[0..cols) into dst (q8_act_row_bytes(cols)
// bytes, 64-byte aligned): d = max|x| / 127 per block, qs = round(x / d).
void quantize_q8_activations(const float* x, int64_t cols, uint8_t* dst);

// Tokens that one pass over a weight row serves: the row is loaded (and
// unpacked) once and multiplied with this many activation vectors.
constexpr int kTokensPerPass = 4;  // run_row_tiles' switch covers 1..4

// Drives RowDot::dot<N>(job, row, first_token, out[N]) over rows
// [row_begin, row_end) and all tokens. Rows are taken in tiles small enough to
// stay in L1/L2 while every group of kTokensPerPass tokens passes over them,
// so prefill reads each weight from DRAM once.
template <typename RowDot>
void run_row_tiles(const MatmulJob& job, int64_t row_begin, int64_t row_end) {
  constexpr size_t kTileBytes = 32 * 1024;
  const int64_t tile_rows = std::clamp<int64_t>(static_cast<int64_t>(kTileBytes / job.row_bytes), 1, 64);
  float out[kTokensPerPass];
  for (int64_t tile = row_begin; tile < row_end; tile += tile_rows) {
    const int64_t tile_end = std::min(row_end, tile + tile_rows);
    for (int64_t t = 0; t < job.n_tokens; t += kTokensPerPass) {
      const int64_t n = std::min<int64_t>(kTokensPerPass, job.n_tokens - t);
      for (int64_t r = tile; r < tile_end; ++r) {
        switch (n) {
          case 4: RowDot::template dot<4>(job, r, t, out); break;
          case 3: RowDot::template dot<3>(job, r, t, out); break;
          case 2: RowDot::template dot<2>(job, r, t, out); break;
          default: RowDot::template dot<1>(job, r, t, out); break;
        }
        for (int64_t i = 0; i < n; ++i) job.y[(t + i) * job.rows + r] = out[i];
      }
    }
  }
}

}  // namespace kvserve
