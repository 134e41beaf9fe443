#pragma once
// Page tables of every sequence over one BlockPool, with automatic prefix
// caching and copy-on-write. Metadata only: the K/V bytes live in
// PagedKVStorage, which the caller updates from the CopyOps returned here.
//
// A sequence's page table maps logical block i (positions [i*B, (i+1)*B),
// B = block_size) to a physical block. Full blocks whose K/V are computed are
// published under hash_block_tokens(parent hash, tokens), so that a later
// sequence whose tokens start the same way reuses them (vLLM's scheme).
//
// Models with sliding-window layers (Gemma 3) may add a second layer group,
// the sliding group, with its own pool and its own table per sequence (vLLM's
// hybrid allocator): a query at position p reads only keys p - window < j <= p
// there, and queries only move forward, so a sliding block wholly before the
// window of the next position to compute is released (its entry becomes
// kNoBlock) while the full group keeps every block. Both groups' blocks of a
// logical block are published under the same hash.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace kvserve {

using SequenceId = uint64_t;

// A sliding-group table entry whose block left every future window and went
// back to the pool.
inline constexpr BlockId kNoBlock = -1;

// Which layers a block holds: the full group (every position) or the sliding
// group (a window of positions).
enum class KVGroup { kFull, kSliding };

// Storage must copy block src's K/V into block dst (every layer of the
// group) before the step that writes dst runs.
struct BlockCopy {
  BlockId src;
  BlockId dst;
  KVGroup group = KVGroup::kFull;
};

// The sliding group of a KVCacheManager: its layers' window and its pool.
struct SlidingKVGroup {
  int64_t window = 0;    // a query at p reads keys p - window < j <= p
  int64_t n_blocks = 0;  // the group's own pool
};

struct PageTable {
  std::vector<BlockId> blocks;   // [n logical blocks] -> physical block (full group)
  std::vector<BlockId> sliding;  // [n logical blocks] -> sliding-group block or kNoBlock; empty without the group
  std::vector<uint64_t> hashes;  // chained hash of each leading full, computed block
};

class KVCacheManager {
 public:
  KVCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching);
  // With a sliding group as well; throws kvserve::Error for a window or pool
  // size that is not positive.
  KVCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching, const SlidingKVGroup& sliding);

  // For a sequence with no blocks: reuses the longest run of cached full
  // blocks that `tokens` starts with, keeping at least one token to compute
  // (its logits are needed). With a sliding group the run ends where that
  // group still holds every block the continuation's window needs (shorter
  // runs are tried; the rest is recomputed). Returns the tokens now backed by
  // computed K/V.
  int64_t match_prefix(SequenceId seq, std::span<const int32_t> tokens);
  // Backs positions [0, n_tokens) with blocks and makes every block holding a
  // position in [write_from, n_tokens) exclusively owned (copy-on-write,
  // appending the copies to `copies`). Every later query of the sequence is at
  // write_from or after, so sliding blocks wholly before write_from's window
  // are released first (even when false is returned: nothing reads them).
  // Otherwise all or nothing: false, with nothing changed, when a pool cannot
  // supply the blocks.
  bool allocate(SequenceId seq, int64_t write_from, int64_t n_tokens, std::vector<BlockCopy>& copies);
  // Whether each group's pool can hand out the blocks the sequence's table
  // must add to cover n_tokens positions, with `spare` more left over.
  bool can_grow(SequenceId seq, int64_t n_tokens, int64_t spare) const;
  // Publishes the full blocks among the first n_computed of `tokens` (the
  // sequence's whole token list) for prefix reuse.
  void commit(SequenceId seq, std::span<const int32_t> tokens, int64_t n_computed);
  // Shrinks the sequence to its first n_tokens positions (speculative
  // rollback): blocks wholly past them go back to the pool, last first; the
  // rows of rejected positions in the kept last block are overwritten later.
  // Published blocks must lie within n_tokens (only final tokens are hashed),
  // and so must released sliding blocks (a rollback stays past the last
  // allocate's write_from).
  void truncate(SequenceId seq, int64_t n_tokens);
  // Shares every block of `parent` with a new sequence `child` (parallel
  // sampling); the first write to a shared block copies it.
  void fork(SequenceId parent, SequenceId child);
  // Releases every block of the sequence (last block first, so that its tail
  // is evicted before its shareable head). Unknown ids are ignored.
  void free(SequenceId seq);

  // The sequence's block table; empty for an unknown sequence.
  std::span<const BlockId> blocks(SequenceId seq) const;
  // Its sliding-group table (kNoBlock where released); empty without the group.
  std::span<const BlockId> sliding_blocks(SequenceId seq) const;
  const BlockPool& pool() const { return pool_; }
  bool has_sliding_group() const { return sliding_pool_.has_value(); }
  const BlockPool& sliding_pool() const;
  int64_t sliding_window() const { return window_; }
  int64_t block_size() const { return pool_.block_size(); }
  bool prefix_caching() const { return prefix_caching_; }
  // Every reference in each pool is held by exactly one page-table entry.
  void check_integrity() const;

 private:
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + block_size() - 1) / block_size(); }
  // Logical blocks before this one hold no key a query at `pos` or later reads.
  int64_t first_sliding_block(int64_t pos) const;
  // Blocks the table must take from `pool` to cover n_tokens with positions
  // [write_from, n_tokens) exclusively owned: new ones plus shared ones to copy.
  int64_t blocks_needed(const BlockPool& pool, const std::vector<BlockId>& table, int64_t write_from,
                        int64_t n_tokens) const;
  void grow(BlockPool& pool, std::vector<BlockId>& table, int64_t write_from, int64_t n_tokens, KVGroup group,
            std::vector<BlockCopy>& copies);
  void release_passed(PageTable& table, int64_t pos);
  // The leading blocks of a prefix hit of n_blocks that the sliding group
  // still has from block first_sliding_block(n_blocks * B) on; false on a miss.
  bool sliding_hit(std::span<const int32_t> tokens, std::span<const uint64_t> hashes, int64_t n_blocks) const;

  BlockPool pool_;
  bool prefix_caching_;
  int64_t window_ = 0;                      // the sliding group's window; 0 without it
  std::optional<BlockPool> sliding_pool_;   // the sliding group's blocks
  std::unordered_map<SequenceId, PageTable> tables_;
};

}  // namespace kvserve
