// The sliding-window layer group of the paged KV cache (Gemma 3's 5 of 6
// layers), without a model: the KVCacheManager releases the blocks every
// later window has passed and keeps the sliding pool bounded by the window,
// prefix hits count only while the sliding group still holds the
// continuation's window, copy-on-write and rollback work in both groups;
// PagedKVStorage keeps each group's layers in its own blocks; and attention
// over a table whose blocks before the window are gone (null) gives the same
// bits as over the whole table, never reading a released block.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/paged_attention.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_planner.h"
#include "kv/paged_kv_storage.h"
#include "test_util.h"

using namespace kvserve;

namespace {

constexpr int64_t kBlock = 4;
constexpr int64_t kWindow = 8;

std::vector<int32_t> tokens_of(int64_t n, int32_t salt = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3 + salt) % 101);
  return t;
}

int64_t held(std::span<const BlockId> table) {
  int64_t n = 0;
  for (BlockId b : table) n += b != kNoBlock ? 1 : 0;
  return n;
}

// Runs `seq` over `tokens` from `from` in chunks of `chunk`, committing each step as the engine does.
void run(KVCacheManager& kv, SequenceId seq, std::span<const int32_t> tokens, int64_t from, int64_t chunk) {
  std::vector<BlockCopy> copies;
  for (int64_t done = from; done < static_cast<int64_t>(tokens.size());) {
    const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(tokens.size()) - done);
    ASSERT_TRUE(kv.allocate(seq, done, done + n, copies));
    done += n;
    kv.commit(seq, tokens, done);
    kv.check_integrity();
  }
}

}  // namespace

TEST(SlidingKV, ReleasesBlocksBehindTheWindowAndStaysBounded) {
  KVCacheManager kv(64, kBlock, false, SlidingKVGroup{kWindow, 64});
  const std::vector<int32_t> t = tokens_of(200);
  std::vector<BlockCopy> copies;
  const int64_t bound = sliding_blocks_per_sequence(kWindow, 1, kBlock);
  for (int64_t pos = 0; pos < 200; ++pos) {
    ASSERT_TRUE(kv.allocate(1, pos, pos + 1, copies));
    const std::span<const BlockId> sliding = kv.sliding_blocks(1);
    ASSERT_EQ(sliding.size(), kv.blocks(1).size());
    EXPECT_LE(kv.sliding_pool().used(), bound) << "at position " << pos;
    // Every block holding a key of pos's window is still there.
    for (int64_t j = std::max<int64_t>(0, pos - kWindow + 1); j <= pos; ++j)
      ASSERT_NE(sliding[static_cast<size_t>(j / kBlock)], kNoBlock) << "key " << j << " of position " << pos;
  }
  EXPECT_EQ(kv.pool().used(), 50);  // the full group keeps every block
  EXPECT_LE(held(kv.sliding_blocks(1)), 3);
  EXPECT_TRUE(copies.empty());
  kv.check_integrity();
  kv.free(1);
  EXPECT_EQ(kv.pool().used() + kv.sliding_pool().used(), 0);
}

TEST(SlidingKV, ChunkedPrefillKeepsTheChunksFirstWindow) {
  KVCacheManager kv(64, kBlock, false, SlidingKVGroup{kWindow, 64});
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 0, 40, copies));
  EXPECT_EQ(held(kv.sliding_blocks(1)), 10);  // nothing computed yet: nothing released
  ASSERT_TRUE(kv.allocate(1, 40, 56, copies));
  // Position 40's window starts at 33 (block 8): blocks 0..7 are gone.
  EXPECT_EQ(held(kv.sliding_blocks(1)), 14 - 8);
  EXPECT_LE(kv.sliding_pool().used(), sliding_blocks_per_sequence(kWindow, 16, kBlock));
  kv.check_integrity();
}

TEST(SlidingKV, AllocationFailsWhenTheSlidingPoolIsShortAndReleasesFirst) {
  KVCacheManager kv(64, kBlock, false, SlidingKVGroup{kWindow, 4});
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(kv.allocate(1, 0, 20, copies));  // 5 sliding blocks at once do not fit in 4
  EXPECT_EQ(kv.pool().used(), 0);
  for (int64_t pos = 0; pos < 40; ++pos) ASSERT_TRUE(kv.allocate(1, pos, pos + 1, copies)) << pos;
  EXPECT_TRUE(kv.can_grow(1, 41, 0));
  EXPECT_FALSE(kv.can_grow(1, 44, 4));  // the full pool has room; the sliding one does not
  kv.check_integrity();
}

TEST(SlidingKV, PrefixHitNeedsTheSlidingBlocksOfTheContinuationsWindow) {
  const std::vector<int32_t> t = tokens_of(41);
  KVCacheManager kv(64, kBlock, true, SlidingKVGroup{kWindow, 64});
  run(kv, 1, t, 0, 1);  // one token a step: the early sliding blocks are released (cached) on the way
  kv.free(1);
  // 40 tokens of 41 are computed and cached; the continuation at 40 needs sliding blocks 8 and 9.
  EXPECT_EQ(kv.match_prefix(2, t), 40);
  EXPECT_EQ(held(kv.sliding_blocks(2)), 2);
  EXPECT_EQ(kv.sliding_blocks(2)[7], kNoBlock);
  kv.check_integrity();
  kv.free(2);
}

TEST(SlidingKV, PrefixHitIsCutWhereTheSlidingGroupLostTheWindow) {
  const std::vector<int32_t> t = tokens_of(41);
  KVCacheManager kv(64, kBlock, true, SlidingKVGroup{kWindow, 12});
  run(kv, 1, t, 0, 41);  // one prefill chunk: every block is held until the end
  kv.free(1);            // last block first: blocks 9, 8, ..., 0 join the LRU list in that order
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(3, 0, 16, copies));  // 4 sliding blocks: the 2 free ones, then 9 and 8 are evicted
  kv.free(3);
  // The full group has blocks 0..9; a hit of 40 would need sliding blocks 8
  // and 9, one of 36 blocks 7 and 8; one of 32 needs 6 and 7, which are there.
  EXPECT_EQ(kv.match_prefix(2, t), 32);
  const std::span<const BlockId> sliding = kv.sliding_blocks(2);
  ASSERT_EQ(sliding.size(), 8u);
  EXPECT_EQ(held(sliding), 2);
  EXPECT_EQ(sliding[5], kNoBlock);
  EXPECT_NE(sliding[6], kNoBlock);
  kv.check_integrity();
  run(kv, 2, t, 32, 1);  // the continuation recomputes from 32
  kv.free(2);
  kv.check_integrity();
}

TEST(SlidingKV, ForkCopiesTheSharedLastBlockInBothGroups) {
  KVCacheManager kv(64, kBlock, false, SlidingKVGroup{kWindow, 64});
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate(1, 0, 30, copies));
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate(1, 30, 31, copies));
  ASSERT_TRUE(kv.allocate(2, 30, 31, copies));
  ASSERT_EQ(copies.size(), 2u);  // the first sequence to write copies the shared last block, in each group
  EXPECT_EQ(copies[0].group, KVGroup::kFull);
  EXPECT_EQ(copies[1].group, KVGroup::kSliding);
  EXPECT_NE(kv.sliding_blocks(1)[7], kv.sliding_blocks(2)[7]);
  EXPECT_EQ(kv.sliding_blocks(1)[5], kv.sliding_blocks(2)[5]);  // still shared, still in the window
  EXPECT_EQ(kv.sliding_blocks(1)[0], kNoBlock);
  kv.check_integrity();
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.sliding_pool().used(), 0);
}

// Speculation: a round writes the pending token + k drafts from write_from,
// then keeps write_from + 1 + accepted; the rollback stays past every
// released block, whatever the window and k.
TEST(SlidingKV, SpeculativeRollbackNeverReachesAReleasedBlock) {
  for (int64_t window : {1, 3, 8}) {
    KVCacheManager kv(256, kBlock, false, SlidingKVGroup{window, 256});
    std::vector<BlockCopy> copies;
    int64_t computed = 0;
    std::mt19937 rng(static_cast<uint32_t>(window));
    while (computed < 150) {
      const int64_t k = rng() % 9, accepted = k == 0 ? 0 : static_cast<int64_t>(rng() % (k + 1));
      ASSERT_TRUE(kv.allocate(1, computed, computed + 1 + k, copies));
      computed += 1 + accepted;
      kv.truncate(1, computed + 1);  // aborts (kvserve::check) if a released block were cut
      kv.check_integrity();
    }
  }
}

TEST(SlidingKV, StorageKeepsEachGroupInItsOwnBlocks) {
  const std::vector<bool> sliding = {true, false, true};
  PagedKVStorage s(sliding, 3, 2, kBlock, 1, 32, KVType::Q8_0);
  EXPECT_TRUE(s.has_sliding_group());
  EXPECT_TRUE(s.is_sliding(0));
  EXPECT_FALSE(s.is_sliding(1));
  std::vector<float> k(32, 1.0f), v(32, 2.0f), k2(32, 3.0f);
  s.write(0, 1, 0, k.data(), v.data());   // sliding block 1 of layer 0
  s.write(1, 2, 0, k2.data(), v.data());  // full block 2 of layer 1
  s.copy_block(1, 0, KVGroup::kSliding);
  EXPECT_EQ(std::memcmp(s.k_block(0, 0), s.k_block(0, 1), s.row_bytes()), 0);
  std::vector<const uint8_t*> kb, vb;
  const std::vector<BlockId> table = {kNoBlock, 1};
  s.append_block_bases(2, table, kb, vb);
  EXPECT_EQ(kb[0], nullptr);
  EXPECT_EQ(kb[1], s.k_block(2, 1));
  EXPECT_EQ(s.bytes(), 2 * (1 * 3 + 2 * 2) * kBlock * s.row_bytes());
}

// A window's worth of keys in a q8_0 table whose blocks before the window are
// null: any read of them would crash; the output is the same bits as with
// every block present.
TEST(SlidingKV, AttentionNeverReadsBlocksBeforeTheWindow) {
  const AttentionShape shape{4, 2, 32, 20};
  const int64_t B = 16, n_kv = 600;  // past two key splits: the decode path may split the keys
  const int64_t n_blocks = (n_kv + B - 1) / B;
  PagedKVStorage s(1, n_blocks, B, shape.n_kv_heads, shape.head_dim, KVType::Q8_0);
  std::mt19937 rng(5);
  for (int64_t p = 0; p < n_kv; ++p) {
    const auto k = test_util::random_vector(64, rng, 1.0f), v = test_util::random_vector(64, rng, 1.0f);
    s.write(0, static_cast<BlockId>(p / B), p % B, k.data(), v.data());
  }
  std::vector<BlockId> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<BlockId>(b);
  for (const auto& [n_q, pos0] : std::vector<std::pair<int64_t, int64_t>>{{1, 599}, {3, 597}, {40, 560}}) {
    const auto q = test_util::random_vector(static_cast<size_t>(n_q * 128), rng, 1.0f);
    std::vector<BlockId> windowed = table;
    for (int64_t b = 0; (b + 1) * B <= shape.first_key(pos0); ++b) windowed[static_cast<size_t>(b)] = kNoBlock;
    std::vector<float> want(q.size()), got(q.size());
    for (const auto& [t, out] : {std::pair{&table, &want}, std::pair{&windowed, &got}}) {
      std::vector<const uint8_t*> kb, vb;
      s.append_block_bases(0, *t, kb, vb);
      const PagedAttentionJob job{q.data(), n_q, pos0, s.k_rows(kb.data()), s.v_rows(vb.data()), out->data()};
      paged_attention(std::span(&job, 1), shape);
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << n_q << " queries at " << pos0;
  }
}
