#pragma once
// Rewrites a GGUF model with its weight matrices in another storage type
// (`kvserve quantize`): metadata copied as is, 1-D tensors (norms, biases)
// kept in f32, every 2-D matrix whose rows are whole blocks of the target
// type re-encoded from its dequantized values.
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kvserve {

struct QuantizeReport {
  int converted = 0;                  // matrices written in the target type
  std::vector<std::string> kept;      // matrices left as they were (rows not whole blocks)
  size_t bytes_in = 0, bytes_out = 0; // tensor data sizes
};

// Throws kvserve::Error for an unreadable input, an unsupported target type
// (f32, f16, bf16, q8_0, q4_0, q4_1) or a write failure.
QuantizeReport quantize_model(const std::string& input, const std::string& output, DType target);

}  // namespace kvserve
