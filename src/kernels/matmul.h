#pragma once
// Matrix products against a weight tensor in any supported storage type.
// W has ne = {cols, rows}: each output row is contiguous in memory (GGUF order).
#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace kvserve {

// y[t * rows + r] = sum_c W[r, c] * x[t * cols + c] for t in [0, n_tokens).
// The fastest path for this CPU (chosen once at start-up); threads over rows.
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y);

// One product of matmul_shared_input(): y = W x, laid out as in matmul().
struct MatmulProduct {
  const TensorView* w;
  float* y;
};
// Several products of the same activations x (e.g. Q, K and V, or the FFN's
// gate and up) in one parallel region: one thread barrier instead of one per
// product, and small products (K, V) split across threads with the rest.
void matmul_shared_input(std::span<const MatmulProduct> products, const float* x, int64_t n_tokens);

// One product of matmul_tasks(): y = W x over n_tokens rows of x, as matmul().
struct MatmulTask {
  const TensorView* w;
  const float* x;
  int64_t n_tokens;
  float* y;
};
// Independent products, each with its own activations (a mixture of experts'
// experts, each over the rows routed to it), in one parallel region: one
// barrier for all, pieces of every product spread over the threads. Products
// with the same x and n_tokens share its prepared (quantized) activations.
// Each product's result is the one matmul() gives it alone.
void matmul_tasks(std::span<const MatmulTask> tasks);

// Plain scalar reference: dequantize each row, dot in f32. Single-threaded.
void matmul_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace kvserve
