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
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace kvserve {

using SequenceId = uint64_t;

// Storage must copy block src's K/V into block dst (every layer) before the
// step that writes dst runs.
struct BlockCopy {
  BlockId src;
  BlockId dst;
};

struct PageTable {
  std::vector<BlockId> blocks;   // [n logical blocks] -> physical block
  std::vector<uint64_t> hashes;  // chained hash of each leading full, computed block
};

class KVCacheManager {
 public:
  KVCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching);

  // For a sequence with no blocks: reuses the longest run of cached full
  // blocks that `tokens` starts with, keeping at least one token to compute
  // (its logits are needed). Returns the tokens now backed by computed K/V.
  int64_t match_prefix(SequenceId seq, std::span<const int32_t> tokens);
  // Backs positions [0, n_tokens) with blocks and makes every block holding a
  // position in [write_from, n_tokens) exclusively owned (copy-on-write,
  // appending the copies to `copies`). All or nothing: false, with nothing
  // changed, when the pool cannot supply the blocks.
  bool allocate(SequenceId seq, int64_t write_from, int64_t n_tokens, std::vector<BlockCopy>& copies);
  // Publishes the full blocks among the first n_computed of `tokens` (the
  // sequence's whole token list) for prefix reuse.
  void commit(SequenceId seq, std::span<const int32_t> tokens, int64_t n_computed);
  // Shrinks the sequence to its first n_tokens positions (speculative
  // rollback): blocks wholly past them go back to the pool, last first; the
  // rows of rejected positions in the kept last block are overwritten later.
  // Published blocks must lie within n_tokens (only final tokens are hashed).
  void truncate(SequenceId seq, int64_t n_tokens);
  // Shares every block of `parent` with a new sequence `child` (parallel
  // sampling); the first write to a shared block copies it.
  void fork(SequenceId parent, SequenceId child);
  // Releases every block of the sequence (last block first, so that its tail
  // is evicted before its shareable head). Unknown ids are ignored.
  void free(SequenceId seq);

  // The sequence's block table; empty for an unknown sequence.
  std::span<const BlockId> blocks(SequenceId seq) const;
  const BlockPool& pool() const { return pool_; }
  int64_t block_size() const { return pool_.block_size(); }
  bool prefix_caching() const { return prefix_caching_; }
  int64_t n_sequences() const { return static_cast<int64_t>(tables_.size()); }
  // Every reference in the pool is held by exactly one page-table entry.
  void check_integrity() const;

 private:
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + block_size() - 1) / block_size(); }

  BlockPool pool_;
  bool prefix_caching_;
  std::unordered_map<SequenceId, PageTable> tables_;
};

}  // namespace kvserve
