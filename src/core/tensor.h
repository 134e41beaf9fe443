#pragma once
// A read-only view of a tensor's bytes (usually inside the mmapped model file).
// Dimensions follow GGUF: ne[0] is the innermost (contiguous) dimension, so a
// weight matrix with ne = {cols, rows} stores each output row contiguously.
#include <array>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace kvserve {

struct TensorView {
  std::string name;
  DType type = DType::F32;
  int n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  // The same weights with rows interleaved by 8 for the 8-bit-activation
  // kernels (kernels/repack.h), or nullptr; owned by whoever repacked them.
  const uint8_t* packed = nullptr;

  int64_t cols() const { return ne[0]; }
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return dtype_row_bytes(type, ne[0]); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes(); }
  std::string shape_string() const;
};

}  // namespace kvserve
