#pragma once
// Matrix products against a weight tensor in any supported storage type.
// W has ne = {cols, rows}: each output row is contiguous in memory (GGUF order).
#include <cstdint>

#include "core/tensor.h"

namespace kvserve {

// y[t * rows + r] = sum_c W[r, c] * x[t * cols + c] for t in [0, n_tokens).
// The fastest path for this CPU (chosen once at start-up); threads over rows.
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y);

// Plain scalar reference: dequantize each row, dot in f32. Single-threaded.
void matmul_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace kvserve
