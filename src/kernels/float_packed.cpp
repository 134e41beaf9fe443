#include "kernels/float_packed.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "kernels/dispatch.h"
#include "kernels/float_packed_kernels.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace {

constexpr int kRows = 8;

size_t value_bytes(DType type) { return type == DType::F32 ? 4 : 2; }

// Row r's values of one group, column after column, into lane r of dst.
template <size_t kBytes>
void interleave_row(const uint8_t* src, int64_t cols, int r, uint8_t* dst) {
  for (int64_t k = 0; k < cols; ++k)
    std::memcpy(dst + (static_cast<size_t>(k) * kRows + r) * kBytes, src + static_cast<size_t>(k) * kBytes, kBytes);
}

float value_at(DType type, const uint8_t* row, int64_t k) {
  if (type == DType::F32) {
    float v;
    std::memcpy(&v, row + 4 * k, sizeof(v));
    return v;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * k, sizeof(h));
  return type == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

}  // namespace

bool float_weight_type(DType type) { return type == DType::F32 || type == DType::F16 || type == DType::BF16; }

size_t float_packed_group_bytes(DType type, int64_t cols) {
  return static_cast<size_t>(cols) * kRows * value_bytes(type);
}

size_t float_packed_matrix_bytes(DType type, int64_t rows, int64_t cols) {
  return static_cast<size_t>((rows + kRows - 1) / kRows) * float_packed_group_bytes(type, cols);
}

void repack_float_rows8(const TensorView& w, uint8_t* dst) {
  if (!float_weight_type(w.type))
    throw Error(std::string("repack_float_rows8: weight type ") + dtype_name(w.type) + " is not a float type");
  const int64_t cols = w.cols(), rows = w.rows();
  const size_t group_bytes = float_packed_group_bytes(w.type, cols);
  for (int64_t g = 0; g * kRows < rows; ++g) {
    uint8_t* out = dst + static_cast<size_t>(g) * group_bytes;
    if (rows - g * kRows < kRows) std::memset(out, 0, group_bytes);  // padding rows
    for (int r = 0; r < kRows && g * kRows + r < rows; ++r) {
      const uint8_t* src = w.row(g * kRows + r);
      if (w.type == DType::F32) interleave_row<4>(src, cols, r, out);
      else interleave_row<2>(src, cols, r, out);
    }
  }
}

void matmul_float_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  if (!float_weight_type(w.type))
    throw Error(std::string("matmul_float_reference: weight type ") + dtype_name(w.type) + " is not a float type");
  const int64_t cols = w.cols(), rows = w.rows();
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = w.row(r);
      float acc = 0.0f;
      for (int64_t k = 0; k < cols; ++k) acc = std::fma(value_at(w.type, row, k), x[t * cols + k], acc);
      y[t * rows + r] = acc;
    }
}

const FloatPackedKernels* active_float_packed_kernels() {
#if KVSERVE_HAVE_SIMD
  switch (active_kernel_table().isa) {
    case Isa::Avx512: return &avx512_float_packed_kernels();
    case Isa::Avx2: return &avx2_float_packed_kernels();
    default: break;
  }
#endif
  return nullptr;
}

bool float_packed_kernels_active() { return active_float_packed_kernels() != nullptr; }

PackedRowsFn float_packed_kernel_for(const FloatPackedKernels& table, DType type) {
  switch (type) {
    case DType::F32: return table.f32;
    case DType::F16: return table.f16;
    case DType::BF16: return table.bf16;
    default: return nullptr;
  }
}

}  // namespace kvserve
