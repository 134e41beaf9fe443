#include "kernels/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/flash_attention.h"
#include "kernels/flash_attention_tile.h"

namespace kvserve {
namespace {

struct WorkItem {
  int64_t job;
  int64_t kv_head;
  int64_t i0, i1;  // query rows [i0, i1) of the job
};

std::vector<WorkItem> work_items(std::span<const PagedAttentionJob> jobs, const AttentionShape& shape) {
  std::vector<WorkItem> items;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t tile = flash_detail::query_tile(jobs[j].n_q, shape.n_kv_heads, omp_get_max_threads());
    for (int64_t h = 0; h < shape.n_kv_heads; ++h)
      for (int64_t i0 = 0; i0 < jobs[j].n_q; i0 += tile)
        items.push_back({static_cast<int64_t>(j), h, i0, std::min(jobs[j].n_q, i0 + tile)});
  }
  return items;
}

}  // namespace

void paged_attention(std::span<const PagedAttentionJob> jobs, const AttentionShape& shape) {
  for (const PagedAttentionJob& j : jobs) flash_detail::validate_attention(j.k, j.v, j.pos0 + j.n_q, shape);
  if (jobs.size() == 1) {
    const PagedAttentionJob& j = jobs[0];
    return flash_attention(j.q, j.n_q, j.pos0, j.k, j.v, j.pos0 + j.n_q, shape, j.out);
  }
  const std::vector<WorkItem> items = work_items(jobs, shape);
  const auto n_items = static_cast<int64_t>(items.size());
#pragma omp parallel
  {
    flash_detail::FlashScratch scratch;
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < n_items; ++it) {
      const WorkItem& item = items[static_cast<size_t>(it)];
      const PagedAttentionJob& j = jobs[static_cast<size_t>(item.job)];
      flash_detail::flash_query_tile(j.q, item.i0, item.i1, j.pos0, j.k, j.v, item.kv_head, shape, scratch, j.out);
    }
  }
}

}  // namespace kvserve
