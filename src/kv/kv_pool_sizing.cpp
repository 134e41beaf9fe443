#include "kv/kv_pool_sizing.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/kv_quant.h"

namespace kvserve {

KVPoolBlocks kv_pool_blocks(const KVShape& shape, const KVPoolRequest& r) {
  if (r.block_size <= 0) throw Error("block_size must be positive, got " + std::to_string(r.block_size));
  // Whether the sliding-window layers' K/V go to their own group, which frees
  // the blocks that left every window (docs/kv_planner.md).
  KVModelShape paged = kv_model_shape(shape);
  if (!r.sliding_group) paged.n_sliding_layers = 0;
  const KVPageLayout page = kv_page_layout(paged, r.type, r.block_size, r.context, std::max<int64_t>(r.chunk, 1));
  const int64_t full_contexts = r.sequences * page.pages_per_sequence;
  // The sliding pool's size: `sequences` sequences' windows.
  const int64_t sliding_cap = std::max<int64_t>(r.sequences, 1) * page.sliding_pages_per_sequence;
  if (r.blocks > 0) return {r.blocks, std::min(r.blocks, sliding_cap)};
  require_kv_type_fits(r.type, shape.head_dim);  // as PagedKVStorage will
  const int64_t full_bytes = page.full_page_bytes + r.extra_bytes_per_block;
  const int64_t sliding_bytes = page.sliding_page_bytes;
  const int64_t per_block = full_bytes + sliding_bytes;
  if (r.memory_bytes > 0 && r.memory_bytes < per_block)
    throw Error("kv_memory_bytes " + std::to_string(r.memory_bytes) + " is smaller than one KV block (" +
                std::to_string(per_block) + " bytes)");
  const int64_t budget = r.memory_bytes > 0 ? r.memory_bytes : int64_t{1} << 30;
  // Full blocks T with T * full_bytes + min(T, sliding_cap) * sliding_bytes <= budget.
  int64_t full = budget / per_block;
  if (full > sliding_cap && page.sliding_layers > 0)
    full = full_bytes > 0 ? (budget - sliding_cap * sliding_bytes) / full_bytes : full_contexts;
  if (r.memory_bytes <= 0) full = std::max<int64_t>(1, std::min(full_contexts, full));
  return {full, std::min(full, sliding_cap)};
}

int64_t kv_pool_bytes(const KVShape& shape, const KVPoolRequest& r, const KVPoolBlocks& pools) {
  KVModelShape paged = kv_model_shape(shape);
  if (!r.sliding_group) paged.n_sliding_layers = 0;
  const KVPageLayout page = kv_page_layout(paged, r.type, r.block_size, r.context, std::max<int64_t>(r.chunk, 1));
  return pools.full * (page.full_page_bytes + r.extra_bytes_per_block) + pools.sliding * page.sliding_page_bytes;
}

KVCacheManager make_kv_manager(const KVShape& shape, const KVPoolBlocks& pools, int64_t block_size, bool prefix_caching) {
  if (pools.sliding == 0) return KVCacheManager(pools.full, block_size, prefix_caching);
  return KVCacheManager(pools.full, block_size, prefix_caching, SlidingKVGroup{shape.sliding_window, pools.sliding});
}

PagedKVStorage make_kv_storage(const KVShape& shape, const KVPoolBlocks& pools, int64_t block_size, KVType type) {
  if (pools.sliding == 0)
    return PagedKVStorage(shape.n_layers, pools.full, block_size, shape.n_kv_heads, shape.head_dim, type,
                          shape.values_in_keys());
  return PagedKVStorage(shape.layer_is_sliding, pools.full, pools.sliding, block_size, shape.n_kv_heads, shape.head_dim,
                        type);
}

}  // namespace kvserve
