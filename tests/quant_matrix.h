#pragma once
// Random quantized matrices for kernel tests: every field random but sane.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/tensor.h"
#include "kernels/dispatch.h"
#include "kernels/quantize.h"
#include "test_util.h"

namespace kvserve::test_util {

// Random blocks with every field random but sane: fp16 scales in a small
// range, any 6-bit (Q4_K / Q5_K) or signed 8-bit (Q6_K) sub-block scales,
// random quants. Covers encodings the simple quantizer never produces.
inline void randomize_block(DType type, uint8_t* block, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  const int64_t nbytes = dtype_info(type).block_bytes;
  for (int64_t i = 0; i < nbytes; ++i) block[i] = static_cast<uint8_t>(byte(rng));
  const uint16_t d = f32_to_fp16(scale(rng)), dmin = f32_to_fp16(scale(rng));
  switch (type) {
    case DType::Q4_0: case DType::Q8_0: case DType::Q5_0: case DType::IQ4_NL: case DType::IQ4_XS:
      std::memcpy(block, &d, 2);
      break;
    case DType::Q4_1:
      std::memcpy(block, &d, 2);
      std::memcpy(block + 2, &dmin, 2);
      break;
    case DType::Q5_1: {  // a negative m, as real weights mostly have
      const uint16_t m = static_cast<uint16_t>(dmin | 0x8000);
      std::memcpy(block, &d, 2);
      std::memcpy(block + 2, &m, 2);
      break;
    }
    case DType::Q4_K:
    case DType::Q5_K:
      std::memcpy(block, &d, 2);
      std::memcpy(block + 2, &dmin, 2);
      break;
    case DType::Q6_K: std::memcpy(block + 208, &d, 2); break;
    case DType::Q3_K: std::memcpy(block + 108, &d, 2); break;
    case DType::Q2_K:
      std::memcpy(block + 80, &d, 2);
      std::memcpy(block + 82, &dmin, 2);
      break;
    default: break;
  }
}

struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;
  TensorView view;
};

// Half the rows from random blocks, half quantized from random floats.
inline TestMatrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  TestMatrix m;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  const int64_t block = dtype_info(type).block_size, block_bytes = dtype_info(type).block_bytes;
  m.bytes.resize(row_bytes * static_cast<size_t>(rows));
  m.dequantized.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * row_bytes;
    if (r % 2 == 0) {
      for (int64_t b = 0; b < cols / block; ++b) randomize_block(type, row + b * block_bytes, rng);
    } else {
      const std::vector<float> values = test_util::random_vector(static_cast<size_t>(cols), rng, 0.5f);
      quantize_row(type, values.data(), row, cols);
    }
    dequantize_row(type, row, m.dequantized.data() + r * cols, cols);
  }
  m.view.name = "test";
  m.view.type = type;
  m.view.n_dims = 2;
  m.view.ne = {cols, rows, 1, 1};
  m.view.data = m.bytes.data();
  m.view.nbytes = m.bytes.size();
  return m;
}

// Restores the kernel ISA and the activation precision a test changes.
class IsaAndPrecisionGuard {
 public:
  IsaAndPrecisionGuard() : isa_(active_isa()), precision_(activation_precision()) {}
  ~IsaAndPrecisionGuard() {
    set_kernel_isa(isa_);
    set_activation_precision(precision_);
  }
  IsaAndPrecisionGuard(const IsaAndPrecisionGuard&) = delete;
  IsaAndPrecisionGuard& operator=(const IsaAndPrecisionGuard&) = delete;

 private:
  Isa isa_;
  ActivationPrecision precision_;
};

}  // namespace kvserve::test_util
