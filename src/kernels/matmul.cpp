#include "kernels/matmul.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "kernels/float_packed.h"
#include "kernels/float_packed_kernels.h"
#include "kernels/kernel_table.h"
#include "kernels/packed_kernels.h"
#include "kernels/repack.h"
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
    case DType::Q5_0: return q8_activations ? table.kquants.q5_0.q8 : table.kquants.q5_0.exact;
    case DType::Q5_1: return q8_activations ? table.kquants.q5_1.q8 : table.kquants.q5_1.exact;
    case DType::IQ4_NL: return q8_activations ? table.kquants.iq4_nl.q8 : table.kquants.iq4_nl.exact;
    case DType::IQ4_XS: return q8_activations ? table.kquants.iq4_xs.q8 : table.kquants.iq4_xs.exact;
    case DType::Q2_K: return q8_activations ? table.kquants.q2_k.q8 : table.kquants.q2_k.exact;
    case DType::Q3_K: return q8_activations ? table.kquants.q3_k.q8 : table.kquants.q3_k.exact;
    case DType::Q4_K: return q8_activations ? table.kquants.q4_k.q8 : table.kquants.q4_k.exact;
    case DType::Q5_K: return q8_activations ? table.kquants.q5_k.q8 : table.kquants.q5_k.exact;
    case DType::Q6_K: return q8_activations ? table.kquants.q6_k.q8 : table.kquants.q6_k.exact;
    default: throw Error(std::string("matmul: weight type ") + dtype_name(type) + " is not supported");
  }
}

bool is_block_quantized(DType type) {
  switch (type) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q8_0: case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL:
    case DType::IQ4_XS: case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default: return false;
  }
}

// Below this many multiply-adds a second thread costs more than it saves.
constexpr int64_t kMinWorkPerThread = 1 << 16;

// Activation buffers of one product.
struct MatmulScratch {
  AlignedBuffer<uint8_t> q8_activations;
  std::vector<float> block_sums;
};

uint8_t* q8_scratch(MatmulScratch& scratch, size_t bytes) {
  if (scratch.q8_activations.size() < bytes) scratch.q8_activations.resize(bytes);
  return scratch.q8_activations.data();
}

// The exact Q4_0/Q4_1/Q4_K/Q5_K kernels fold a 32-value block's offset as
// offset * sum(x), so they need the block sums of x (Q5_0, Q5_1, the IQ4 types and
// Q6_K dequantize in registers instead).
bool needs_block_sums(DType type, bool q8_activations) {
  return !q8_activations &&
         (type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q4_K || type == DType::Q5_K);
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
#if KVSERVE_HAVE_SIMD
  if (active_isa() == Isa::Avx512) return quantize_q8_activations_avx512(x, cols, order, dst);
#endif
  quantize_q8_activations_scalar(x, cols, order, dst);
}

void quantize_q8_activations_scalar(const float* x, int64_t cols, Q8Order order, uint8_t* dst) {
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

namespace {

constexpr size_t kMaxSharedProducts = 8;

// Each product's rows go out in kPiecesPerThread contiguous pieces per thread,
// taken dynamically: a thread slowed by the shared host takes fewer, instead of
// the other waiting at the barrier (a fifth of a q8 decode step's samples were
// that wait). SmolLM2 q8, 2 threads, same run: pp512 372-506 -> 510-563 tok/s;
// decode unchanged within noise; 8 pieces per thread was slower.
constexpr int64_t kPiecesPerThread = 4;

// One product of a matmul_shared_input() call, with its prepared activations.
struct PreparedProduct {
  MatmulJob job;
  MatmulRowsFn kernel = nullptr;
  Q8Order order = Q8Order::Plain;
  // Set when the weights are repacked (kernels/repack.h) and activations are
  // 8-bit: then packed_job / packed_kernel run instead of job / kernel, over
  // row groups of 8, and xq holds activations of packed_type's kind.
  PackedRowsFn packed_kernel = nullptr;
  PackedJob packed_job;
  DType packed_type = DType::F32;
  // Whether this product prepares 8-bit activations into xq / block sums into
  // sums (its job reads them there); false when it reads an earlier product's
  // (share_prepared_input) or needs none.
  bool quantized = false;
  bool block_sums = false;
  uint8_t* xq = nullptr;
  float* sums = nullptr;

  void prepare_token(int64_t t) const {
    const float* xt = job.x + t * job.cols;
    if (quantized && packed_kernel != nullptr) {
      quantize_packed_activations(packed_type, xt, job.cols, xq + static_cast<size_t>(t) * packed_job.xq_row_bytes);
      return;
    }
    if (quantized) quantize_q8_activations(xt, job.cols, order, xq + t * q8_act_row_bytes(job.cols));
    if (block_sums) x_block_sum_pairs(xt, job.cols, sums + t * x_block_sum_floats(job.cols));
  }
  // Piece k of `pieces` contiguous row ranges.
  void run_piece(int64_t k, int64_t pieces) const {
    if (packed_kernel != nullptr) {
      // Split on pairs of groups: the 512-bit kernels take two a call.
      const int64_t groups = (job.rows + 7) / 8, pairs = (groups + 1) / 2;
      const int64_t g0 = 2 * (pairs * k / pieces), g1 = std::min(groups, 2 * (pairs * (k + 1) / pieces));
      if (g0 < g1) packed_kernel(packed_job, g0, g1);
      return;
    }
    const int64_t r0 = job.rows * k / pieces, r1 = job.rows * (k + 1) / pieces;
    if (r0 < r1) kernel(job, r0, r1);
  }
};

// The packed kernel for w where w is repacked, activations are 8-bit and this
// ISA has packed kernels; else nullptr.
PackedRowsFn packed_kernel_of(const TensorView& w, bool q8_activations) {
  const PackedKernels* table = active_packed_kernels();
  if (w.packed == nullptr || !q8_activations || table == nullptr) return nullptr;
  return packed_kernel_for(*table, w.type);
}

// The packed float GEMM for w where w is a repacked float matrix and this ISA
// has that GEMM; else nullptr. Whatever the activation precision: float
// weights always multiply the exact f32 activations (kernels/float_packed.h).
PackedRowsFn float_packed_kernel_of(const TensorView& w) {
  const FloatPackedKernels* table = active_float_packed_kernels();
  if (w.packed == nullptr || table == nullptr) return nullptr;
  return float_packed_kernel_for(*table, w.type);
}

PreparedProduct prepare_product(const MatmulProduct& p, const float* x, int64_t n_tokens, MatmulScratch& scratch) {
  const TensorView& w = *p.w;
  const int64_t block = dtype_info(w.type).block_size;
  if (is_block_quantized(w.type) && w.cols() % block != 0)
    throw Error("matmul: " + w.name + " has " + std::to_string(w.cols()) + " columns, not a multiple of the " +
                dtype_name(w.type) + " block size " + std::to_string(block));
  PreparedProduct out;
  out.quantized = is_block_quantized(w.type) && activation_precision() == ActivationPrecision::kQ8;
  out.job = {w.data, w.row_bytes(), w.cols(), w.rows(), n_tokens, x, nullptr, nullptr, p.y};
  if (const PackedRowsFn gemm = float_packed_kernel_of(w); gemm != nullptr) {  // reads x itself: nothing to prepare
    out.packed_kernel = gemm;
    out.packed_type = w.type;
    out.packed_job = {w.packed, float_packed_group_bytes(w.type, w.cols()), w.cols(), w.rows(), n_tokens,
                      reinterpret_cast<const uint8_t*>(x), sizeof(float) * static_cast<size_t>(w.cols()), p.y};
    return out;
  }
  out.packed_kernel = packed_kernel_of(w, out.quantized);
  if (out.packed_kernel != nullptr) {
    out.packed_type = w.type;
    const size_t row_bytes = packed_act_row_bytes(w.type, w.cols());
    out.xq = q8_scratch(scratch, static_cast<size_t>(n_tokens) * row_bytes);
    out.packed_job = {w.packed, packed_group_bytes(w.type, w.cols()), w.cols(), w.rows(), n_tokens, out.xq, row_bytes, p.y};
    return out;
  }
  out.kernel = rows_kernel(active_kernel_table(), w.type, out.quantized);
  out.order = q8_order_for(w.type);
  out.block_sums = needs_block_sums(w.type, out.quantized);
  if (out.quantized) out.xq = q8_scratch(scratch, static_cast<size_t>(n_tokens) * q8_act_row_bytes(w.cols()));
  if (out.block_sums) {
    scratch.block_sums.resize(static_cast<size_t>(n_tokens * x_block_sum_floats(w.cols())));
    out.sums = scratch.block_sums.data();
  }
  out.job.xq = out.xq;
  out.job.x_block_sums = out.sums;
  return out;
}

// Q, K and V (or gate and up) read the same x: a later product whose
// activations would be prepared exactly as an earlier one's reads those.
void share_prepared_input(const PreparedProduct& earlier, PreparedProduct& p) {
  if (earlier.job.cols != p.job.cols) return;
  const bool p_packed = p.packed_kernel != nullptr, earlier_packed = earlier.packed_kernel != nullptr;
  if (p_packed || earlier_packed) {
    if (p.quantized && earlier.quantized && p_packed && earlier_packed &&
        packed_act_is_256(p.packed_type) == packed_act_is_256(earlier.packed_type)) {
      p.packed_job.xq = earlier.xq;
      p.xq = nullptr;
      p.quantized = false;
    }
    return;
  }
  if (p.quantized && earlier.quantized && earlier.order == p.order) {
    p.job.xq = earlier.xq;
    p.xq = nullptr;  // nothing to prepare
    p.quantized = false;
  }
  if (p.block_sums && earlier.block_sums) {
    p.job.x_block_sums = earlier.sums;
    p.sums = nullptr;
    p.block_sums = false;
  }
}

}  // namespace

const PackedKernels* active_packed_kernels() {
#if KVSERVE_HAVE_SIMD
  switch (active_kernel_table().isa) {
    case Isa::Avx512: return &avx512_packed_kernels();
    case Isa::Avx2: return &avx2_packed_kernels();
    default: break;
  }
#endif
  return nullptr;
}

bool packed_kernels_active() { return active_packed_kernels() != nullptr; }

PackedRowsFn packed_kernel_for(const PackedKernels& table, DType type) {
  switch (type) {
    case DType::Q4_0: return table.q4_0;
    case DType::Q4_1: return table.q4_1;
    case DType::Q5_0: return table.q5_0;
    case DType::Q5_1: return table.q5_1;
    case DType::IQ4_NL: return table.iq4_nl;
    case DType::IQ4_XS: return table.iq4_xs;
    case DType::Q2_K: return table.q2_k;
    case DType::Q3_K: return table.q3_k;
    case DType::Q8_0: return table.q8_0;
    case DType::Q4_K: return table.q4_k;
    case DType::Q5_K: return table.q5_k;
    case DType::Q6_K: return table.q6_k;
    default: return nullptr;
  }
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  const MatmulProduct product{&w, y};
  matmul_shared_input(std::span(&product, 1), x, n_tokens);
}

void matmul_shared_input(std::span<const MatmulProduct> products, const float* x, int64_t n_tokens) {
  std::array<MatmulTask, kMaxSharedProducts> tasks;
  if (products.size() > kMaxSharedProducts) throw Error("matmul_shared_input: too many products");
  for (size_t i = 0; i < products.size(); ++i) tasks[i] = {products[i].w, x, n_tokens, products[i].y};
  matmul_tasks(std::span(tasks.data(), products.size()));
}

void matmul_tasks(std::span<const MatmulTask> tasks) {
  // One scratch per product and thread of the caller, reused across calls: a
  // decode step makes ~100 calls, and fresh allocations showed up as page
  // faults and memsets.
  // (The parallel region below reaches them through these locals: a
  // thread_local named there would be each thread's own.)
  thread_local std::vector<MatmulScratch> scratch_storage;
  thread_local std::vector<PreparedProduct> prepared_storage;
  thread_local std::vector<int64_t> prepare_ends_storage;
  std::vector<MatmulScratch>& scratch = scratch_storage;
  std::vector<PreparedProduct>& prepared = prepared_storage;
  std::vector<int64_t>& prepare_ends = prepare_ends_storage;  // running count of the tokens each product prepares
  if (scratch.size() < tasks.size()) scratch.resize(tasks.size());
  prepared.resize(tasks.size());
  prepare_ends.resize(tasks.size());
  int64_t work = 0, max_tokens = 0, to_prepare = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const MatmulTask& t = tasks[i];
    prepared[i] = prepare_product({t.w, t.y}, t.x, t.n_tokens, scratch[i]);
    work += prepared[i].job.rows * prepared[i].job.cols * t.n_tokens;
    max_tokens = std::max(max_tokens, t.n_tokens);
    for (size_t j = 0; j < i; ++j)
      if (tasks[j].x == t.x && tasks[j].n_tokens == t.n_tokens) share_prepared_input(prepared[j], prepared[i]);
    if (prepared[i].quantized || prepared[i].block_sums) to_prepare += t.n_tokens;
    prepare_ends[i] = to_prepare;
  }
  // Single tokens are prepared here: splitting them across threads would cost
  // an OpenMP barrier for a few hundred operations.
  const bool prepare_in_region = max_tokens > 1;
  if (!prepare_in_region)
    for (const PreparedProduct& p : prepared) p.prepare_token(0);

  const int max_threads = static_cast<int>(std::clamp<int64_t>(work / kMinWorkPerThread, 1, omp_get_max_threads()));
  const auto n_products = static_cast<int64_t>(prepared.size());
#pragma omp parallel num_threads(max_threads)
  {
    if (prepare_in_region) {
      // Every product's tokens in one loop (one barrier, however many products).
#pragma omp for schedule(static)
      for (int64_t f = 0; f < to_prepare; ++f) {
        const auto i = static_cast<size_t>(std::upper_bound(prepare_ends.begin(), prepare_ends.end(), f) - prepare_ends.begin());
        prepared[i].prepare_token(f - (prepare_ends[i] - tasks[i].n_tokens));
      }
    }
    const int64_t n_threads = omp_get_num_threads();
    const int64_t pieces = n_threads == 1 ? 1 : n_threads * kPiecesPerThread;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t i = 0; i < n_products * pieces; ++i) prepared[static_cast<size_t>(i / pieces)].run_piece(i % pieces, pieces);
  }
}

}  // namespace kvserve
