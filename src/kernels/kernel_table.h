#pragma once
// Internal to src/kernels: the per-ISA kernel table and the data a matmul
// kernel works on. Included by the *_avx2.cpp / *_avx512.cpp translation
// units, so everything here is either a plain type or a template (a non-template
// inline function compiled with -mavx512f in one file could be the copy the
// linker keeps for every caller, and crash a CPU without AVX-512).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/dispatch.h"

namespace kvserve {

// Functions defined in this header are `static` (one private copy per
// translation unit) for the reason above.

// Per-block scale of the 8-bit activations: x[j] ~= d * qs[j] and
// s = d * sum(qs) (the term that a weight offset or zero point multiplies).
struct Q8ActScale {
  float d;
  float s;
};

// Byte order of the quantized activations. Plain: each block's 32 values in
// element order. NibblePairs (for Q4 weights): blocks 2k and 2k+1 share 64
// bytes as [2k: 0..15, 2k+1: 0..15, 2k: 16..31, 2k+1: 16..31], which is the
// order the low and high nibbles of two Q4 blocks come out of one shift; a
// trailing odd block stays plain.
enum class Q8Order { Plain, NibblePairs };

// Offsets of block b's elements 0..15 (first) and 16..31 (second) in qs.
struct Q8HalfOffsets {
  int64_t first, second;
};
static inline Q8HalfOffsets q8_half_offsets(Q8Order order, int64_t block, int64_t n_blocks) {
  const int64_t pair_base = block / 2 * 64;
  if (order == Q8Order::Plain || (block % 2 == 0 && block + 1 == n_blocks)) return {block * 32, block * 32 + 16};
  const int64_t lane = block % 2 * 16;
  return {pair_base + lane, pair_base + 32 + lane};
}

// One token's activations quantized to 8 bits in blocks of 32, the form the
// integer dot products of the Q4_0 / Q4_1 / Q8_0 kernels consume.
struct Q8ActRow {
  const int8_t* qs;         // cols values in the matmul's Q8Order, 64-byte aligned
  const Q8ActScale* scales; // cols / 32 entries, 16-byte aligned
};

static inline size_t q8_act_qs_bytes(int64_t cols) { return (static_cast<size_t>(cols) + 63) / 64 * 64; }

// Bytes one token's Q8ActRow takes in a buffer (qs, then scales), a multiple
// of 64 so consecutive tokens stay aligned.
static inline size_t q8_act_row_bytes(int64_t cols) {
  const size_t scale_bytes = static_cast<size_t>(cols / 32) * sizeof(Q8ActScale);
  return q8_act_qs_bytes(cols) + (scale_bytes + 63) / 64 * 64;
}

// Quantizes one token's activations x[0..cols) into dst (q8_act_row_bytes(cols)
// bytes, 64-byte aligned): d = max|x| / 127 per block, qs = round(x / d).
// Picks the AVX-512 loop where the active kernel table is AVX-512; the scalar
// loop is the reference (both give the same bytes).
void quantize_q8_activations(const float* x, int64_t cols, Q8Order order, uint8_t* dst);
void quantize_q8_activations_scalar(const float* x, int64_t cols, Q8Order order, uint8_t* dst);
#if KVSERVE_HAVE_SIMD
void quantize_q8_activations_avx512(const float* x, int64_t cols, Q8Order order, uint8_t* dst);
#endif

// Everything one matmul call needs; kernels compute rows [row_begin, row_end).
struct MatmulJob {
  const uint8_t* w = nullptr;  // row-major weights, row_bytes apart
  size_t row_bytes = 0;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t n_tokens = 0;
  const float* x = nullptr;       // n_tokens x cols (float weight types)
  const uint8_t* xq = nullptr;    // n_tokens Q8ActRows of q8_act_row_bytes(cols) (quantized types)
  // f32 activations against Q4 weights: per token, per 32-column block, the
  // pair {0, sum of the block's x} (see x_block_sum_pairs), which the weight
  // offset multiplies.
  const float* x_block_sums = nullptr;
  float* y = nullptr;             // n_tokens x rows
};

// Floats one token takes in MatmulJob::x_block_sums.
static inline int64_t x_block_sum_floats(int64_t cols) { return cols / 32 * 2; }

// {0, sum(x[32 b .. 32 b + 31])} for every block b of one token. The zero
// lane lets a kernel multiply-add a weight block's [d, offset] scales by the
// pair in one instruction: lane 1 collects offset * sum(x), lane 0 stays 0.
void x_block_sum_pairs(const float* x, int64_t cols, float* pairs);

static inline Q8ActRow q8_act_row(const MatmulJob& job, int64_t token) {
  const uint8_t* base = job.xq + static_cast<size_t>(token) * q8_act_row_bytes(job.cols);
  return {reinterpret_cast<const int8_t*>(base), reinterpret_cast<const Q8ActScale*>(base + q8_act_qs_bytes(job.cols))};
}

using MatmulRowsFn = void (*)(const MatmulJob& job, int64_t row_begin, int64_t row_end);

// One weight type's two kernels: 8-bit activations (job.xq, Q8Order::Plain)
// and f32 activations (job.x, plus job.x_block_sums where the type has an offset).
struct QuantKernels {
  MatmulRowsFn q8;
  MatmulRowsFn exact;
};
// Q5_0, Q5_1, the IQ4 types and the K-quants, defined per ISA in matmul_kquants_<isa>.cpp.
struct KQuantKernels {
  QuantKernels q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k;
};
const KQuantKernels& scalar_kquant_kernels();
#if KVSERVE_HAVE_SIMD
const KQuantKernels& avx2_kquant_kernels();
const KQuantKernels& avx512_kquant_kernels();
#endif

struct KernelTable {
  Isa isa;
  MatmulRowsFn f32;
  MatmulRowsFn f16;
  MatmulRowsFn bf16;
  MatmulRowsFn q4_0;        // 8-bit activations (job.xq)
  MatmulRowsFn q4_1;
  MatmulRowsFn q8_0;
  MatmulRowsFn q4_0_exact;  // f32 activations (job.x): weights dequantized in registers
  MatmulRowsFn q4_1_exact;
  MatmulRowsFn q8_0_exact;
  KQuantKernels kquants;  // Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K..Q6_K
};

// Which activations a weight type's kernels read (the same for every ISA, so
// all paths multiply by identical quantized values).
static inline Q8Order q8_order_for(DType type) {
  return type == DType::Q4_0 || type == DType::Q4_1 ? Q8Order::NibblePairs : Q8Order::Plain;
}

const KernelTable& scalar_kernel_table();
#if KVSERVE_HAVE_SIMD
const KernelTable& avx2_kernel_table();
const KernelTable& avx512_kernel_table();
#endif
// The table matmul() uses (see dispatch.h).
const KernelTable& active_kernel_table();

// Shape of one kernel call: RowDot::dot<R, N>(job, first_row, row_step,
// first_token, out[R * N]) computes rows first_row + r * row_step (r < R)
// times tokens first_token + i (i < N) into out[r * N + i].
//
// Decode (one token) and small batches (up to kSmallBatchTokens, e.g. a
// speculative verification pass of 2..9 tokens) take R rows at once, far
// apart (row_step = 1/R of the thread's slice) so that each is its own
// monotonic stream for the hardware prefetcher, which neighbouring rows read
// in lockstep defeat; each weight block is loaded and unpacked once and used
// for all N tokens of the call, so a pass over n tokens streams the weights
// once. More tokens than a kernel holds in registers (RowDot's kMaxTokens)
// go in balanced groups over the same R rows, which then come from L1.
// Independent R * N accumulator chains hide the FMA and reduction latency.
// Prefill (more tokens) takes one row at a time in tiles that stay in L1/L2
// while every group of tokens passes over them.
constexpr int kRowsPerPass = 4;           // rows of a one-token pass (default)
constexpr int kTokensPerPass = 4;         // tokens of one call, unless RowDot says kMaxTokens
constexpr int kMaxTokensPerPass = 8;      // the most any kernel takes (the switches below)
constexpr int64_t kSmallBatchTokens = 16; // up to here: the decode-like pass

// RowDot::kMaxTokens where given (at most kMaxTokensPerPass), else kTokensPerPass.
template <typename RowDot>
constexpr int max_tokens_per_call() {
  if constexpr (requires { RowDot::kMaxTokens; }) return RowDot::kMaxTokens;
  else return kTokensPerPass;
}
// Rows per call with n tokens: RowDot::rows_for(n) where given, else 4 rows
// for one token, 2 for two, 1 beyond (16 registers hold R * N accumulators
// plus the unpacked weights).
template <typename RowDot>
constexpr int rows_per_call(int n) {
  if constexpr (requires { RowDot::rows_for(1); }) return RowDot::rows_for(n);
  else return n == 1 ? kRowsPerPass : n == 2 ? 2 : 1;
}

template <typename RowDot, int R, int N>
void dot_and_store(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token) {
  float out[R * N];
  RowDot::template dot<R, N>(job, first_row, row_step, first_token, out);
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < N; ++i) job.y[(first_token + i) * job.rows + first_row + r * row_step] = out[r * N + i];
}

// One call over rows first_row + r * row_step (r < R) and tokens
// [first_token, first_token + n), 1 <= n <= kMaxTokensPerPass.
template <typename RowDot, int R>
void dot_and_store_n(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, int64_t n) {
  switch (n) {
    case 8: if constexpr (max_tokens_per_call<RowDot>() >= 8) { dot_and_store<RowDot, R, 8>(job, first_row, row_step, first_token); break; } [[fallthrough]];
    case 7: if constexpr (max_tokens_per_call<RowDot>() >= 7) { dot_and_store<RowDot, R, 7>(job, first_row, row_step, first_token); break; } [[fallthrough]];
    case 6: if constexpr (max_tokens_per_call<RowDot>() >= 6) { dot_and_store<RowDot, R, 6>(job, first_row, row_step, first_token); break; } [[fallthrough]];
    case 5: if constexpr (max_tokens_per_call<RowDot>() >= 5) { dot_and_store<RowDot, R, 5>(job, first_row, row_step, first_token); break; } [[fallthrough]];
    case 4: dot_and_store<RowDot, R, 4>(job, first_row, row_step, first_token); break;
    case 3: dot_and_store<RowDot, R, 3>(job, first_row, row_step, first_token); break;
    case 2: dot_and_store<RowDot, R, 2>(job, first_row, row_step, first_token); break;
    default: dot_and_store<RowDot, R, 1>(job, first_row, row_step, first_token); break;
  }
}

// The decode-like pass over rows [row_begin, row_end) for all tokens, which
// come in `groups` balanced groups of at most N tokens (the largest group).
template <typename RowDot, int N>
void run_small_batch(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t groups) {
  constexpr int R = rows_per_call<RowDot>(N);
  const int64_t base = job.n_tokens / groups, extra = job.n_tokens % groups;  // sizes base + (g < extra)
  const auto all_tokens = [&](auto dot, int64_t row, int64_t step) {
    for (int64_t g = 0, t = 0; g < groups; ++g) {
      const int64_t n = base + (g < extra ? 1 : 0);
      dot(row, step, t, n);
      t += n;
    }
  };
  const int64_t step = (row_end - row_begin) / R;
  if (groups == 1) {  // decode and n <= kMaxTokens: no group loop per row
    for (int64_t r = row_begin; r < row_begin + step; ++r) dot_and_store<RowDot, R, N>(job, r, step, 0);
  } else {
    for (int64_t r = row_begin; r < row_begin + step; ++r)
      all_tokens([&](int64_t row, int64_t s, int64_t t, int64_t n) {
        if (n == N) dot_and_store<RowDot, R, N>(job, row, s, t);
        else dot_and_store_n<RowDot, R>(job, row, s, t, n);
      }, r, step);
  }
  for (int64_t r = row_begin + step * R; r < row_end; ++r)
    all_tokens([&](int64_t row, int64_t s, int64_t t, int64_t n) { dot_and_store_n<RowDot, 1>(job, row, s, t, n); },
               r, 1);
}

// Runs RowDot over rows [row_begin, row_end) and all tokens. For prefill the
// rows are taken in tiles small enough to stay in L1/L2 while every group of
// tokens passes over them, so each weight comes from DRAM once.
template <typename RowDot>
void run_row_tiles(const MatmulJob& job, int64_t row_begin, int64_t row_end) {
  constexpr int kMax = max_tokens_per_call<RowDot>();
  static_assert(kMax >= kTokensPerPass && kMax <= kMaxTokensPerPass);
  if (job.n_tokens <= kSmallBatchTokens) {
    const int64_t groups = (job.n_tokens + kMax - 1) / kMax;
    switch ((job.n_tokens + groups - 1) / groups) {  // the largest group
      case 8: if constexpr (kMax >= 8) { run_small_batch<RowDot, 8>(job, row_begin, row_end, groups); break; } [[fallthrough]];
      case 7: if constexpr (kMax >= 7) { run_small_batch<RowDot, 7>(job, row_begin, row_end, groups); break; } [[fallthrough]];
      case 6: if constexpr (kMax >= 6) { run_small_batch<RowDot, 6>(job, row_begin, row_end, groups); break; } [[fallthrough]];
      case 5: if constexpr (kMax >= 5) { run_small_batch<RowDot, 5>(job, row_begin, row_end, groups); break; } [[fallthrough]];
      case 4: run_small_batch<RowDot, 4>(job, row_begin, row_end, groups); break;
      case 3: run_small_batch<RowDot, 3>(job, row_begin, row_end, groups); break;
      case 2: run_small_batch<RowDot, 2>(job, row_begin, row_end, groups); break;
      default: run_small_batch<RowDot, 1>(job, row_begin, row_end, groups); break;
    }
    return;
  }
  constexpr size_t kTileBytes = 32 * 1024;
  const int64_t tile_rows = std::clamp<int64_t>(static_cast<int64_t>(kTileBytes / job.row_bytes), 1, 64);
  for (int64_t tile = row_begin; tile < row_end; tile += tile_rows) {
    const int64_t tile_end = std::min(row_end, tile + tile_rows);
    for (int64_t t = 0; t < job.n_tokens; t += kMax) {
      const int64_t n = std::min<int64_t>(kMax, job.n_tokens - t);
      for (int64_t r = tile; r < tile_end; ++r) dot_and_store_n<RowDot, 1>(job, r, 1, t, n);
    }
  }
}

}  // namespace kvserve
