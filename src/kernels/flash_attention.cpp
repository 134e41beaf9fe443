#include "kernels/flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvserve {
namespace {

constexpr int64_t kKeyTile = 64;     // keys per tile: a 64 x head_dim K tile stays in L1/L2
constexpr int64_t kQueryTile = 16;   // query positions per work item in prefill
constexpr int64_t kMinKeysPerSplit = 256;

float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Query rows of one work item, all reading the same K/V head.
struct RowBlock {
  int64_t n_rows = 0;
  std::vector<const float*> q;  // [n_rows] -> head_dim floats
  std::vector<int64_t> pos;     // [n_rows] the row's position (sees keys <= pos)
  std::vector<OnlineSoftmax> state;
  std::vector<float> acc;       // [n_rows][head_dim] unnormalized output
};

// Folds keys [j0, j1) of K/V head `kv_offset` into every row's state.
void attend_keys(RowBlock& rows, const float* k, const float* v, int64_t kv_stride, int64_t kv_offset,
                 int64_t head_dim, float scale, int64_t j0, int64_t j1) {
  float scores[kKeyTile];
  for (int64_t t0 = j0; t0 < j1; t0 += kKeyTile) {
    const int64_t t1 = std::min(j1, t0 + kKeyTile);
    for (int64_t r = 0; r < rows.n_rows; ++r) {
      const int64_t last = std::min(t1, rows.pos[r] + 1);  // causal: keys <= pos
      if (last <= t0) continue;                             // tile entirely above the diagonal
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = t0; j < last; ++j) {
        scores[j - t0] = dot(rows.q[r], k + j * kv_stride + kv_offset, head_dim) * scale;
        tile_max = std::max(tile_max, scores[j - t0]);
      }
      OnlineSoftmax& st = rows.state[r];
      float* o = rows.acc.data() + r * head_dim;
      const float new_max = std::max(st.max, tile_max);
      const float rescale = st.max == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(st.max - new_max);
      if (rescale != 1.0f)
        for (int64_t d = 0; d < head_dim; ++d) o[d] *= rescale;
      st.sum *= rescale;
      st.max = new_max;
      for (int64_t j = t0; j < last; ++j) {
        const float p = std::exp(scores[j - t0] - new_max);
        st.sum += p;
        const float* vj = v + j * kv_stride + kv_offset;
        for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vj[d];
      }
    }
  }
}

void reset_rows(RowBlock& rows, int64_t n_rows, int64_t head_dim) {
  rows.n_rows = n_rows;
  rows.q.resize(static_cast<size_t>(n_rows));
  rows.pos.resize(static_cast<size_t>(n_rows));
  rows.state.assign(static_cast<size_t>(n_rows), OnlineSoftmax{});
  rows.acc.assign(static_cast<size_t>(n_rows * head_dim), 0.0f);
}

// Prefill: work items are (K/V head, tile of query positions); every query
// head of the group joins the item, so each K/V tile is read once per item.
void flash_prefill(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t kv_stride,
                   const AttentionShape& s, float* out) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads, q_stride = s.n_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_tiles = (n_q + kQueryTile - 1) / kQueryTile;
#pragma omp parallel
  {
    RowBlock rows;
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < s.n_kv_heads * n_tiles; ++item) {
      const int64_t kvh = item / n_tiles, i0 = (item % n_tiles) * kQueryTile;
      const int64_t i1 = std::min(n_q, i0 + kQueryTile);
      reset_rows(rows, (i1 - i0) * group, hd);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t g = 0; g < group; ++g) {
          const int64_t r = (i - i0) * group + g;
          rows.q[r] = q + i * q_stride + (kvh * group + g) * hd;
          rows.pos[r] = pos0 + i;
        }
      attend_keys(rows, k, v, kv_stride, kvh * hd, hd, scale, 0, pos0 + i1);
      for (int64_t r = 0; r < rows.n_rows; ++r) {
        const int64_t i = i0 + r / group, h = kvh * group + r % group;
        const float inv = rows.state[r].sum > 0 ? 1.0f / rows.state[r].sum : 0.0f;
        for (int64_t d = 0; d < hd; ++d) out[i * q_stride + h * hd + d] = rows.acc[r * hd + d] * inv;
      }
    }
  }
}

// Decode: the keys are split into chunks processed in parallel; the partial
// (max, sum, output) of each chunk are merged exactly at the end.
void flash_decode(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                  int64_t kv_stride, const AttentionShape& s, float* out, int64_t n_splits) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads, q_stride = s.n_heads * hd;
  const int64_t n_rows = n_q * group;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t chunk = (n_kv + n_splits - 1) / n_splits;
  std::vector<RowBlock> partial(static_cast<size_t>(s.n_kv_heads * n_splits));
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < s.n_kv_heads * n_splits; ++item) {
    const int64_t kvh = item / n_splits, split = item % n_splits;
    RowBlock& rows = partial[static_cast<size_t>(item)];
    reset_rows(rows, n_rows, hd);
    for (int64_t r = 0; r < n_rows; ++r) {
      rows.q[r] = q + (r / group) * q_stride + (kvh * group + r % group) * hd;
      rows.pos[r] = pos0 + r / group;
    }
    attend_keys(rows, k, v, kv_stride, kvh * hd, hd, scale, split * chunk, std::min(n_kv, (split + 1) * chunk));
  }
  for (int64_t kvh = 0; kvh < s.n_kv_heads; ++kvh) {
    for (int64_t r = 0; r < n_rows; ++r) {
      OnlineSoftmax total;
      std::vector<float> o(static_cast<size_t>(hd), 0.0f);
      for (int64_t split = 0; split < n_splits; ++split) {
        const RowBlock& p = partial[static_cast<size_t>(kvh * n_splits + split)];
        float a = 0, b = 0;
        total.merge(p.state[r], &a, &b);
        for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * a + p.acc[r * hd + d] * b;
      }
      const float inv = total.sum > 0 ? 1.0f / total.sum : 0.0f;
      float* dst = out + (r / group) * q_stride + (kvh * group + r % group) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] = o[d] * inv;
    }
  }
}

}  // namespace

float OnlineSoftmax::add(float score) {
  if (score == -std::numeric_limits<float>::infinity()) return 1.0f;
  if (score <= max) {
    sum += std::exp(score - max);
    return 1.0f;
  }
  const float rescale = max == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(max - score);
  sum = sum * rescale + 1.0f;
  max = score;
  return rescale;
}

void OnlineSoftmax::merge(const OnlineSoftmax& other, float* scale_self, float* scale_other) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const float new_max = std::max(max, other.max);
  *scale_self = max == ninf ? 0.0f : std::exp(max - new_max);
  *scale_other = other.max == ninf ? 0.0f : std::exp(other.max - new_max);
  sum = sum * *scale_self + other.sum * *scale_other;
  max = new_max;
}

void online_softmax(const float* x, int64_t n, float* out) {
  OnlineSoftmax st;
  for (int64_t i = 0; i < n; ++i) st.add(x[i]);
  for (int64_t i = 0; i < n; ++i)
    out[i] = st.sum > 0 && x[i] != -std::numeric_limits<float>::infinity() ? std::exp(x[i] - st.max) / st.sum : 0.0f;
}

void flash_attention(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                     int64_t kv_stride, const AttentionShape& shape, float* out) {
  const int64_t threads = omp_get_max_threads();
  // Few query rows against a long context: not enough (head, tile) items to
  // keep every thread busy, so split the keys instead.
  const int64_t prefill_items = shape.n_kv_heads * ((n_q + kQueryTile - 1) / kQueryTile);
  if (n_q <= 4 && prefill_items < threads * 2 && n_kv >= 2 * kMinKeysPerSplit) {
    const int64_t splits = std::clamp<int64_t>(n_kv / kMinKeysPerSplit, 1, threads * 4);
    flash_decode(q, n_q, pos0, k, v, n_kv, kv_stride, shape, out, splits);
  } else {
    flash_prefill(q, n_q, pos0, k, v, kv_stride, shape, out);
  }
}

}  // namespace kvserve
