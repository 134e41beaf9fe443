// The engine's pool sizing (kv/kv_pool_sizing.h) and `kvserve kv-size`
// (plan_kv_cache) share one page layout: a budget of what kv-size says a batch
// takes holds exactly that batch in the engine's pools.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/kv_planner.h"
#include "kv/kv_pool_sizing.h"
#include "kv/kv_shape.h"

namespace kvserve {
namespace {

// Six layers, the first five sliding over 48 keys (tiny-gemma3's pattern).
KVShape sliding_shape() {
  KVShape s;
  s.n_layers = 6;
  s.layer_is_sliding = {true, true, true, true, true, false};
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.sliding_window = 48;
  s.context_length = 256;
  return s;
}

KVPlanRequest plan_request() {
  KVPlanRequest r;
  r.ctx = 1000;
  r.batch = 3;
  r.block_size = 8;
  r.type = KVType::F16;
  r.chunk = 40;
  return r;
}

KVPoolRequest pool_request(const KVPlanRequest& plan) {
  KVPoolRequest r;
  r.block_size = plan.block_size;
  r.type = plan.type;
  r.context = plan.ctx;
  r.sequences = plan.batch;
  r.chunk = plan.chunk;
  return r;
}

TEST(KVPoolSizing, ABudgetOfWhatKvSizePlansHoldsThatBatch) {
  const KVShape shape = sliding_shape();
  const KVPlanRequest request = plan_request();
  const KVPlan plan = plan_kv_cache(kv_model_shape(shape), request);
  KVPoolRequest pool = pool_request(request);
  pool.memory_bytes = plan.allocated_bytes;
  const KVPoolBlocks blocks = kv_pool_blocks(shape, pool);
  const int64_t pages = plan.allocated_tokens_per_seq / request.block_size;
  EXPECT_EQ(pages, 125);
  EXPECT_EQ(plan.sliding_pages_per_seq, 12);  // window 48 + chunk 40 in pages of 8, + 1
  EXPECT_EQ(blocks.full, request.batch * pages);
  EXPECT_EQ(blocks.sliding, request.batch * plan.sliding_pages_per_seq);
}

TEST(KVPoolSizing, WithoutASlidingGroupEveryLayerKeepsEveryPage) {
  const KVShape shape = sliding_shape();
  const KVPlanRequest request = plan_request();
  const KVPlan plan = plan_kv_cache(kv_model_shape(shape), request);
  KVPoolRequest pool = pool_request(request);
  pool.sliding_group = false;
  pool.memory_bytes = plan.every_position_bytes_per_seq * request.batch;
  const KVPoolBlocks blocks = kv_pool_blocks(shape, pool);
  EXPECT_EQ(blocks.full, request.batch * 125);
  EXPECT_EQ(blocks.sliding, 0);
}

TEST(KVPoolSizing, AnExplicitCountCapsTheSlidingPoolAtTheWindows) {
  KVPoolRequest pool = pool_request(plan_request());
  pool.blocks = 100;
  const KVPoolBlocks blocks = kv_pool_blocks(sliding_shape(), pool);
  EXPECT_EQ(blocks.full, 100);
  EXPECT_EQ(blocks.sliding, 3 * 12);
  pool.blocks = 20;
  EXPECT_EQ(kv_pool_blocks(sliding_shape(), pool).sliding, 20);  // no more than the full pool
}

TEST(KVPoolSizing, ADraftModelsBytesCountWithEachFullBlock) {
  KVShape shape = sliding_shape();
  shape.layer_is_sliding.assign(6, false);
  shape.sliding_window = 0;
  KVPoolRequest pool = pool_request(plan_request());
  const int64_t page = 6 * 2 * 2 * 32 * 2 * 8;  // layers x (K, V) x heads x head_dim x f16 x tokens
  pool.memory_bytes = 10 * page;
  EXPECT_EQ(kv_pool_blocks(shape, pool).full, 10);
  pool.extra_bytes_per_block = page;
  EXPECT_EQ(kv_pool_blocks(shape, pool).full, 5);
  pool.memory_bytes = page;
  EXPECT_THROW(kv_pool_blocks(shape, pool), Error);  // under one block with its draft
}

}  // namespace
}  // namespace kvserve
