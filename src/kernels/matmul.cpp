#include "kernels/matmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "kernels/kernel_table.h"
#include "kernels/quantize.h"

namespace kvserve {
namespace {

void matmul_rows_scalar(const TensorView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1,
                        std::vector<float>& row) {
  const int64_t cols = w.cols(), rows = w.rows();
  row.resize(static_cast<size_t>(cols));
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(w.type, w.row(r), row.data(), cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * cols;
      float sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += row[c] * xt[c];
      y[t * rows + r] = sum;
    }
  }
}

MatmulRowsFn rows_kernel(const KernelTable& table, DType type, bool q8_activations) {
  switch (type) {
    case DType::F32: return table.f32;
    case DType::F16: return table.f16;
    case DType::BF16: return table.bf16;
    case DType::Q4_0: return q8_activations ? table.q4_0 : table.q4_0_exact;
    case DType::Q4_1: return q8_activations ? table.q4_1 : table.q4_1_exact;
    case DType::Q8_0: return q8_activations ? table.q8_0 : table.q8_0_exact;
    default: throw Error(std::string("matmul: weight type ") + dtype_name(type) + " is not supported");
  }
}

bool is_block_quantized(DType type) { return type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q8_0; }

// Below this many multiply-adds a second thread costs more than it saves.
constexpr int64_t kMinWorkPerThread = 1 << 16;

// Per-thread scratch reused across calls: a decode step makes ~200 matmul
// calls, and a fresh allocation in each showed up as page faults and memsets.
struct MatmulScratch {
  AlignedBuffer<uint8_t> q8_activations;
  std::vector<float> block_sums;
};

uint8_t* q8_scratch(MatmulScratch& scratch, size_t bytes) {
  if (scratch.q8_activations.size() < bytes) scratch.q8_activations.resize(bytes);
  return scratch.q8_activations.data();
}

// The exact Q4 kernels fold a block's offset as offset * sum(x), so they need
// the block sums of x.
bool needs_block_sums(DType type, bool q8_activations) {
  return !q8_activations && (type == DType::Q4_0 || type == DType::Q4_1);
}

}  // namespace

void x_block_sum_pairs(const float* x, int64_t cols, float* pairs) {
  for (int64_t b = 0; b < cols / 32; ++b) {
    float sum = 0;
    for (int j = 0; j < 32; ++j) sum += x[b * 32 + j];
    pairs[2 * b] = 0.0f;
    pairs[2 * b + 1] = sum;
  }
}

void quantize_q8_activations(const float* x, int64_t cols, Q8Order order, uint8_t* dst) {
  auto* qs = reinterpret_cast<int8_t*>(dst);
  auto* scales = reinterpret_cast<Q8ActScale*>(dst + q8_act_qs_bytes(cols));
  const int64_t n_blocks = cols / 32;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float inv_d = d != 0 ? 1.0f / d : 0.0f;
    const Q8HalfOffsets at = q8_half_offsets(order, b, n_blocks);
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(xb[j] * inv_d));
      qs[(j < 16 ? at.first : at.second) + j % 16] = static_cast<int8_t>(q);
      sum += q;
    }
    scales[b] = {d, d * static_cast<float>(sum)};
  }
}

void matmul_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row;
  matmul_rows_scalar(w, x, n_tokens, y, 0, w.rows(), row);
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  const bool quantized = is_block_quantized(w.type) && activation_precision() == ActivationPrecision::kQ8;
  const MatmulRowsFn kernel = rows_kernel(active_kernel_table(), w.type, quantized);
  const Q8Order order = q8_order_for(w.type);
  if (is_block_quantized(w.type) && w.cols() % 32 != 0)
    throw Error("matmul: " + w.name + " has " + std::to_string(w.cols()) + " columns, not a multiple of 32");

  MatmulJob job;
  job.w = w.data;
  job.row_bytes = w.row_bytes();
  job.cols = w.cols();
  job.rows = w.rows();
  job.n_tokens = n_tokens;
  job.x = x;
  job.y = y;
  thread_local MatmulScratch scratch;
  uint8_t* const xq = quantized ? q8_scratch(scratch, static_cast<size_t>(n_tokens) * q8_act_row_bytes(job.cols)) : nullptr;
  job.xq = xq;
  const bool block_sums = needs_block_sums(w.type, quantized);
  const int64_t sum_floats = x_block_sum_floats(job.cols);
  if (block_sums) scratch.block_sums.resize(static_cast<size_t>(n_tokens * sum_floats));
  // A plain pointer: inside the parallel region `scratch` would name each
  // worker thread's own (empty) thread_local copy.
  float* const sums = scratch.block_sums.data();
  job.x_block_sums = sums;

  // Per-token preparation of the activations (8-bit quantization or block
  // sums). One token is prepared before the parallel region: splitting it
  // would cost an OpenMP barrier for a few hundred adds.
  const auto prepare_token = [&](int64_t t) {
    if (quantized) quantize_q8_activations(x + t * job.cols, job.cols, order, xq + t * q8_act_row_bytes(job.cols));
    if (block_sums) x_block_sum_pairs(x + t * job.cols, job.cols, sums + t * sum_floats);
  };
  const bool prepare_in_region = n_tokens > 1 && (quantized || block_sums);
  if (n_tokens == 1) prepare_token(0);

  const int64_t work = job.rows * job.cols * n_tokens;
  const int max_threads = static_cast<int>(std::clamp<int64_t>(work / kMinWorkPerThread, 1, omp_get_max_threads()));
#pragma omp parallel num_threads(max_threads)
  {
    if (prepare_in_region) {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < n_tokens; ++t) prepare_token(t);
    }
    // One contiguous slice of rows per thread, so each streams its own part of W.
    const int64_t n_threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t slice = (job.rows + n_threads - 1) / n_threads;
    const int64_t r0 = std::min(job.rows, thread * slice), r1 = std::min(job.rows, r0 + slice);
    if (r0 < r1) kernel(job, r0, r1);
  }
}

}  // namespace kvserve
