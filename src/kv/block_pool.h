#pragma once
// KV block metadata for the paged cache: which physical blocks are free,
// referenced by sequences, or kept unreferenced for prefix reuse. Holds no
// K/V bytes (kv/paged_kv_storage.h does); testable without any model.
//
// Every block is in exactly one of three states:
//   free    ref_count == 0, no hash           (on free_ , a stack)
//   used    ref_count >  0                    (owned by page tables)
//   cached  ref_count == 0, hash registered   (on the LRU list, oldest first)
// allocate() takes a free block first and evicts the least recently released
// cached block only when no free block is left (vLLM's scheme, with the free
// and cached queues kept apart so that eviction happens only when needed).
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvserve {

using BlockId = int32_t;

// Hash of a full block's tokens chained with the hash of the block before it
// (0 for the first block): equal hashes mean equal whole prefixes.
uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens);

class BlockPool {
 public:
  BlockPool(int64_t n_blocks, int64_t block_size);

  int64_t total() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t free() const { return static_cast<int64_t>(free_.size()); }
  int64_t cached() const { return n_cached_; }
  int64_t used() const { return total() - free() - cached(); }
  // Blocks allocate() can hand out now (free + evictable cached).
  int64_t available() const { return free() + cached(); }

  // A block with ref_count 1 and no hash; nullopt when every block is used.
  std::optional<BlockId> allocate();
  // Adds a reference (sharing); a cached block becomes used again.
  void retain(BlockId id);
  // Drops a reference; at zero the block becomes cached (if hashed) or free.
  void release(BlockId id);

  // The cached-or-used block registered under `hash` whose tokens equal
  // `tokens`; nullopt on a miss. Does not retain it.
  std::optional<BlockId> lookup(uint64_t hash, std::span<const int32_t> tokens) const;
  // Registers a full, computed, used block under `hash`. A block already
  // hashed, or a hash already registered to another block, is left as is.
  void publish(BlockId id, uint64_t hash, std::span<const int32_t> tokens);

  int32_t ref_count(BlockId id) const { return blocks_[index(id)].ref_count; }
  bool is_hashed(BlockId id) const { return blocks_[index(id)].hashed; }
  // Aborts (kvserve::check) if the counts, lists and hash map disagree.
  void check_integrity() const;

 private:
  static constexpr BlockId kNone = -1;
  struct Block {
    int32_t ref_count = 0;
    bool hashed = false;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;  // [block_size] when hashed: guards against hash collisions
    BlockId lru_prev = kNone;     // links while cached
    BlockId lru_next = kNone;
  };
  size_t index(BlockId id) const;
  void lru_push_back(BlockId id);
  void lru_remove(BlockId id);
  void evict(BlockId id);

  int64_t block_size_;
  std::vector<Block> blocks_;                          // [n_blocks]
  std::vector<BlockId> free_;                          // stack of free blocks
  BlockId lru_head_ = kNone, lru_tail_ = kNone;        // cached blocks, least recent first
  int64_t n_cached_ = 0;
  std::unordered_map<uint64_t, BlockId> by_hash_;
};

}  // namespace kvserve
