#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops.h"

namespace kvserve {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

float AttentionShape::score_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

void attention_reference(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                         int64_t kv_stride, const AttentionShape& shape, float* out) {
  const int64_t hd = shape.head_dim, q_stride = shape.n_heads * hd;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const float scale = shape.score_scale();
  std::vector<float> scores(static_cast<size_t>(n_q * n_kv));  // [n_q][n_kv], one head at a time
  for (int64_t h = 0; h < shape.n_heads; ++h) {
    const int64_t kvh = h / group;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n_q; ++i) {
      float* row = scores.data() + i * n_kv;
      const float* qi = q + i * q_stride + h * hd;
      const int64_t first = shape.first_key(pos0 + i);
      for (int64_t j = 0; j < n_kv; ++j)
        row[j] = j >= first && j <= pos0 + i ? dot(qi, k + j * kv_stride + kvh * hd, hd) * scale
                                             : -std::numeric_limits<float>::infinity();
      softmax(row, n_kv);
      float* o = out + i * q_stride + h * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = 0;
      for (int64_t j = first; j < n_kv && j <= pos0 + i; ++j) {
        const float* vj = v + j * kv_stride + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] += row[j] * vj[d];
      }
    }
  }
}

}  // namespace kvserve
