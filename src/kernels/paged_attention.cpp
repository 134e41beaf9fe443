#include "kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvserve {
namespace {

constexpr int64_t kQueryTile = 16;  // query positions per work item

struct WorkItem {
  int64_t job;
  int64_t kv_head;
  int64_t i0, i1;  // query rows [i0, i1) of the job
};

float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Accumulators of one work item: rows are (query, head-of-group) pairs.
struct RowState {
  std::vector<const float*> q;  // [n_rows] -> head_dim floats
  std::vector<int64_t> last;    // [n_rows] last visible key position
  std::vector<float> max, sum;  // [n_rows] online softmax
  std::vector<float> acc;       // [n_rows][head_dim] unnormalized output
  std::vector<float> scores;    // [block_size]
};

// Folds keys [base, base + n) of one block into every row that sees them.
void attend_block(RowState& st, const float* k, const float* v, int64_t base, int64_t n, int64_t kv_stride,
                  int64_t head_offset, int64_t head_dim, float scale) {
  for (size_t r = 0; r < st.q.size(); ++r) {
    const int64_t visible = std::min(n, st.last[r] - base + 1);
    if (visible <= 0) continue;
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      st.scores[static_cast<size_t>(j)] = dot(st.q[r], k + j * kv_stride + head_offset, head_dim) * scale;
      block_max = std::max(block_max, st.scores[static_cast<size_t>(j)]);
    }
    const float new_max = std::max(st.max[r], block_max);
    const float rescale = std::isinf(st.max[r]) ? 0.0f : std::exp(st.max[r] - new_max);
    float* o = st.acc.data() + r * static_cast<size_t>(head_dim);
    if (rescale != 1.0f)
      for (int64_t d = 0; d < head_dim; ++d) o[d] *= rescale;
    st.sum[r] *= rescale;
    st.max[r] = new_max;
    for (int64_t j = 0; j < visible; ++j) {
      const float p = std::exp(st.scores[static_cast<size_t>(j)] - new_max);
      st.sum[r] += p;
      const float* vj = v + j * kv_stride + head_offset;
      for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vj[d];
    }
  }
}

void run_item(const PagedAttentionJob& job, const WorkItem& item, int64_t B, int64_t kv_stride,
              const AttentionShape& s, RowState& st) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads, q_stride = s.n_heads * hd;
  const auto n_rows = static_cast<size_t>((item.i1 - item.i0) * group);
  st.q.resize(n_rows);
  st.last.resize(n_rows);
  st.max.assign(n_rows, -std::numeric_limits<float>::infinity());
  st.sum.assign(n_rows, 0.0f);
  st.acc.assign(n_rows * static_cast<size_t>(hd), 0.0f);
  st.scores.resize(static_cast<size_t>(B));
  for (int64_t i = item.i0; i < item.i1; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const auto r = static_cast<size_t>((i - item.i0) * group + g);
      st.q[r] = job.q + i * q_stride + (item.kv_head * group + g) * hd;
      st.last[r] = job.pos0 + i;
    }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_keys = job.pos0 + item.i1;
  for (int64_t b = 0; b * B < n_keys; ++b)
    attend_block(st, job.k_blocks[b], job.v_blocks[b], b * B, std::min(B, n_keys - b * B), kv_stride,
                 item.kv_head * hd, hd, scale);
  for (size_t r = 0; r < n_rows; ++r) {
    const int64_t i = item.i0 + static_cast<int64_t>(r) / group, h = item.kv_head * group + static_cast<int64_t>(r) % group;
    const float inv = st.sum[r] > 0 ? 1.0f / st.sum[r] : 0.0f;
    for (int64_t d = 0; d < hd; ++d) job.out[i * q_stride + h * hd + d] = st.acc[r * static_cast<size_t>(hd) + static_cast<size_t>(d)] * inv;
  }
}

}  // namespace

void paged_attention(std::span<const PagedAttentionJob> jobs, int64_t block_size, int64_t kv_stride,
                     const AttentionShape& shape) {
  std::vector<WorkItem> items;
  for (size_t j = 0; j < jobs.size(); ++j)
    for (int64_t h = 0; h < shape.n_kv_heads; ++h)
      for (int64_t i0 = 0; i0 < jobs[j].n_q; i0 += kQueryTile)
        items.push_back({static_cast<int64_t>(j), h, i0, std::min(jobs[j].n_q, i0 + kQueryTile)});
  const auto n_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    RowState st;
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < n_items; ++it) {
      const WorkItem& item = items[static_cast<size_t>(it)];
      run_item(jobs[static_cast<size_t>(item.job)], item, block_size, kv_stride, shape, st);
    }
  }
}

}  // namespace kvserve
