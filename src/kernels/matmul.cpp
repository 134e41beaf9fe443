#include "kernels/matmul.h"

#include <vector>

#include "core/error.h"
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

}  // namespace

void matmul_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row;
  matmul_rows_scalar(w, x, n_tokens, y, 0, w.rows(), row);
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  const int64_t rows = w.rows();
#pragma omp parallel
  {
    std::vector<float> row;
#pragma omp for schedule(static)
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      matmul_rows_scalar(w, x, n_tokens, y, r0, std::min(rows, r0 + 16), row);
    }
  }
}

}  // namespace kvserve
