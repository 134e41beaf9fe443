#pragma once
// How many blocks the engine's K/V pools hold, and the pools themselves: from
// a model's KVShape and the engine's limits, with the page layout that
// `kvserve kv-size` plans with (kv_page_layout, kv_planner.h), so that the two
// cannot drift. docs/kv_planner.md.
#include <cstdint>

#include "kv/kv_cache_manager.h"
#include "kv/kv_planner.h"
#include "kv/kv_shape.h"
#include "kv/paged_kv_storage.h"

namespace kvserve {

// What the engine asks of its pools.
struct KVPoolRequest {
  int64_t block_size = 16;
  KVType type = KVType::F32;
  int64_t context = 0;    // tokens per sequence at most
  int64_t sequences = 1;  // running at once
  int64_t chunk = 1;      // tokens per step (sliding layers keep a window plus a chunk)
  int64_t blocks = 0;     // an explicit block count; 0: from the byte budget
  int64_t memory_bytes = 0;  // the byte budget; 0: room for `sequences` full contexts, at most 1 GiB
  // Bytes that come with each full block: a draft model's pool has as many
  // blocks as the full pool, so its bytes count with them.
  int64_t extra_bytes_per_block = 0;
  // Whether sliding-window layers may have their own pool (a pipeline's
  // stages mirror one pool shape, so their ranks keep every position).
  bool sliding_group = true;
};

// Blocks in each group's pool (sliding 0: no sliding group).
struct KVPoolBlocks {
  int64_t full = 0;
  int64_t sliding = 0;
};

// Blocks in the pool: an explicit count, a byte budget, or room for
// `sequences` full contexts capped at 1 GiB. With a sliding group, that
// group's pool holds `sequences` windows (no more than the full pool) and the
// full pool gets the rest of the budget. Throws kvserve::Error for a
// non-positive block size, a budget under one block, or a KV type the head
// size cannot hold.
KVPoolBlocks kv_pool_blocks(const KVShape& shape, const KVPoolRequest& request);

// The bytes pools of these sizes take (K/V of both groups, and the extra bytes of
// each full block): what PagedKVStorage and a draft model's pool allocate.
int64_t kv_pool_bytes(const KVShape& shape, const KVPoolRequest& request, const KVPoolBlocks& pools);

// The block tables and the K/V bytes of pools of these sizes.
KVCacheManager make_kv_manager(const KVShape& shape, const KVPoolBlocks& pools, int64_t block_size, bool prefix_caching);
PagedKVStorage make_kv_storage(const KVShape& shape, const KVPoolBlocks& pools, int64_t block_size, KVType type);

}  // namespace kvserve
