// KV metadata with no model: the block pool, page tables, prefix caching and
// copy-on-write, including a long random walk that checks the pool is
// conserved and every reference is accounted for after each step.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/kv_cache_manager.h"

using namespace kvserve;

namespace {

std::vector<int32_t> tokens_of(int64_t n, int32_t seed) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 31 + seed * 7) % 1000));
  return t;
}

}  // namespace

TEST(BlockPool, AllocatesEveryBlockThenReportsFull) {
  BlockPool pool(4, 16);
  std::vector<BlockId> got;
  for (int i = 0; i < 4; ++i) got.push_back(*pool.allocate());
  EXPECT_FALSE(pool.allocate().has_value());
  EXPECT_EQ(pool.used(), 4);
  EXPECT_EQ(pool.free(), 0);
  for (BlockId b : got) pool.release(b);
  EXPECT_EQ(pool.free(), 4);
  pool.check_integrity();
  EXPECT_THROW(BlockPool(0, 16), Error);
  EXPECT_THROW(BlockPool(4, 0), Error);
}

TEST(BlockPool, CachedBlocksAreEvictedLeastRecentFirstAndOnlyWhenNeeded) {
  BlockPool pool(3, 2);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  const BlockId ba = *pool.allocate(), bb = *pool.allocate();
  pool.publish(ba, 100, a);
  pool.publish(bb, 200, b);
  pool.release(ba);  // released first: evicted first
  pool.release(bb);
  EXPECT_EQ(pool.cached(), 2);
  EXPECT_EQ(pool.free(), 1);
  const BlockId fresh = *pool.allocate();  // the free block, no eviction
  EXPECT_EQ(pool.cached(), 2);
  EXPECT_EQ(pool.lookup(100, a), ba);
  const BlockId evicted = *pool.allocate();
  EXPECT_EQ(evicted, ba);
  EXPECT_FALSE(pool.lookup(100, a).has_value());
  EXPECT_EQ(pool.lookup(200, b), bb);
  EXPECT_FALSE(pool.lookup(200, a).has_value());  // same hash, other tokens: a collision is a miss
  pool.retain(bb);                                // a hit takes it off the LRU list
  EXPECT_EQ(pool.cached(), 0);
  EXPECT_FALSE(pool.allocate().has_value());
  (void)fresh;
  pool.check_integrity();
}

TEST(PrefixCache, ChainedHashesDependOnThePrefix) {
  const std::vector<int32_t> x = {5, 6, 7, 8};
  EXPECT_EQ(hash_block_tokens(0, x), hash_block_tokens(0, x));
  EXPECT_NE(hash_block_tokens(0, x), hash_block_tokens(1, x));
  EXPECT_NE(hash_block_tokens(0, x), hash_block_tokens(0, std::vector<int32_t>{5, 6, 8, 7}));
}

TEST(PrefixCache, SecondSequenceReusesFullBlocksAndKeepsOneTokenToCompute) {
  KVCacheManager kv(16, 4, true);
  std::vector<BlockCopy> copies;
  const auto prompt = tokens_of(10, 1);  // 2 full blocks + 2 tokens
  EXPECT_EQ(kv.match_prefix(1, prompt), 0);
  ASSERT_TRUE(kv.allocate(1, 0, 10, copies));
  kv.commit(1, prompt, 10);
  EXPECT_EQ(kv.match_prefix(2, prompt), 8);
  EXPECT_EQ(kv.blocks(2)[0], kv.blocks(1)[0]);
  EXPECT_EQ(kv.blocks(2)[1], kv.blocks(1)[1]);
  ASSERT_TRUE(kv.allocate(2, 8, 10, copies));
  EXPECT_NE(kv.blocks(2)[2], kv.blocks(1)[2]);
  EXPECT_TRUE(copies.empty());
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.pool().cached(), 2);
  // An 8-token prompt exactly covering the cached blocks reuses only the first:
  // its last token must be computed to give logits.
  EXPECT_EQ(kv.match_prefix(3, std::span<const int32_t>(prompt).first(8)), 4);
  // A different first block misses everything after it too.
  auto other = prompt;
  other[0] = 999;
  EXPECT_EQ(kv.match_prefix(4, other), 0);
  kv.check_integrity();
}

TEST(PageTable, CopyOnWriteGivesAForkItsOwnPartialBlock) {
  KVCacheManager kv(8, 4, false);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 0, 6, copies));  // blocks 0 (full) and 1 (2 of 4 used)
  kv.fork(1, 2);
  EXPECT_EQ(kv.pool().ref_count(kv.blocks(1)[1]), 2);
  ASSERT_TRUE(kv.allocate(2, 6, 7, copies));  // the child writes position 6: shared block 1 is copied
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, kv.blocks(1)[1]);
  EXPECT_EQ(copies[0].dst, kv.blocks(2)[1]);
  EXPECT_EQ(kv.blocks(2)[0], kv.blocks(1)[0]);  // the full block stays shared
  copies.clear();
  ASSERT_TRUE(kv.allocate(1, 6, 7, copies));  // the parent now owns its block alone
  EXPECT_TRUE(copies.empty());
  kv.check_integrity();
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.pool().free(), 8);
}

TEST(PageTable, AllocationIsAllOrNothing) {
  KVCacheManager kv(3, 4, false);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 0, 8, copies));
  EXPECT_FALSE(kv.allocate(2, 0, 8, copies));
  EXPECT_TRUE(kv.blocks(2).empty());
  EXPECT_EQ(kv.pool().free(), 1);
  EXPECT_TRUE(kv.allocate(2, 0, 4, copies));
  kv.check_integrity();
}

// Thousands of random operations on many sequences: allocate/grow, share
// (fork), publish, prefix-match, release. After every one the pool is
// conserved and the ref counts equal the page tables' references.
TEST(BlockPool, PropertyRandomOperationsConserveThePool) {
  std::mt19937_64 rng(42);
  KVCacheManager kv(64, 4, true);
  std::map<SequenceId, std::vector<int32_t>> live;  // sequence -> its tokens
  std::map<SequenceId, int64_t> length;             // tokens backed by blocks
  SequenceId next = 1;
  std::vector<BlockCopy> copies;
  const auto pick = [&]() { auto it = live.begin(); std::advance(it, rng() % live.size()); return it->first; };
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 5);
    if (op == 0 || live.empty()) {  // new sequence, maybe sharing a prefix family
      const SequenceId s = next++;
      auto tokens = tokens_of(4 + static_cast<int64_t>(rng() % 40), static_cast<int32_t>(rng() % 3));
      const int64_t hit = kv.match_prefix(s, tokens);
      const int64_t want = hit + 1 + static_cast<int64_t>(rng() % 8);
      if (want <= static_cast<int64_t>(tokens.size()) && kv.allocate(s, hit, want, copies)) {
        live[s] = tokens;
        length[s] = want;
      } else {
        kv.free(s);
      }
    } else if (op == 1) {  // grow
      const SequenceId s = pick();
      const int64_t want = std::min<int64_t>(length[s] + 1 + static_cast<int64_t>(rng() % 6), static_cast<int64_t>(live[s].size()));
      if (kv.allocate(s, length[s], want, copies)) length[s] = want;
    } else if (op == 2) {  // publish what is computed
      const SequenceId s = pick();
      kv.commit(s, live[s], length[s]);
    } else if (op == 3) {  // share (parallel sampling)
      const SequenceId s = pick(), child = next++;
      kv.fork(s, child);
      live[child] = live[s];
      length[child] = length[s];
    } else {  // release
      const SequenceId s = pick();
      kv.free(s);
      live.erase(s);
      length.erase(s);
    }
    kv.check_integrity();
    const BlockPool& p = kv.pool();
    ASSERT_EQ(p.free() + p.used() + p.cached(), p.total()) << "step " << step;
  }
  for (const auto& [s, t] : live) kv.free(s);
  kv.check_integrity();
  EXPECT_EQ(kv.pool().used(), 0);
  EXPECT_EQ(kv.pool().free() + kv.pool().cached(), 64);
}
