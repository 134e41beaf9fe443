#include "kv/block_pool.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {
namespace {

// splitmix64's finalizer: a cheap, well-mixed 64-bit permutation.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent_hash ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL;
  return h;
}

BlockPool::BlockPool(int64_t n_blocks, int64_t block_size) : block_size_(block_size) {
  if (n_blocks <= 0) throw Error("the KV pool needs at least one block, got " + std::to_string(n_blocks));
  if (block_size <= 0) throw Error("the KV block size must be positive, got " + std::to_string(block_size));
  blocks_.resize(static_cast<size_t>(n_blocks));
  // Highest id at the bottom of the stack: allocation hands out 0, 1, 2...
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(static_cast<BlockId>(i));
}

size_t BlockPool::index(BlockId id) const {
  check(id >= 0 && static_cast<size_t>(id) < blocks_.size(), "block id inside the pool");
  return static_cast<size_t>(id);
}

std::optional<BlockId> BlockPool::allocate() {
  BlockId id = kNone;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (lru_head_ != kNone) {
    id = lru_head_;
    lru_remove(id);
    evict(id);
  } else {
    return std::nullopt;
  }
  Block& b = blocks_[index(id)];
  check(b.ref_count == 0 && !b.hashed, "an allocated block starts unreferenced and unhashed");
  b.ref_count = 1;
  return id;
}

void BlockPool::retain(BlockId id) {
  Block& b = blocks_[index(id)];
  if (b.ref_count == 0) {
    check(b.hashed, "only a cached block is retained from zero references");
    lru_remove(id);
  }
  b.ref_count++;
}

void BlockPool::release(BlockId id) {
  Block& b = blocks_[index(id)];
  check(b.ref_count > 0, "release of a referenced block");
  if (--b.ref_count > 0) return;
  if (b.hashed) lru_push_back(id);
  else free_.push_back(id);
}

std::optional<BlockId> BlockPool::lookup(uint64_t hash, std::span<const int32_t> tokens) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Block& b = blocks_[index(it->second)];
  if (!std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end())) return std::nullopt;
  return it->second;
}

void BlockPool::publish(BlockId id, uint64_t hash, std::span<const int32_t> tokens) {
  Block& b = blocks_[index(id)];
  check(b.ref_count > 0, "only a used block is published");
  check(static_cast<int64_t>(tokens.size()) == block_size_, "only a full block is published");
  if (b.hashed || by_hash_.count(hash) != 0) return;
  b.hashed = true;
  b.hash = hash;
  b.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(hash, id);
}

void BlockPool::evict(BlockId id) {
  Block& b = blocks_[index(id)];
  by_hash_.erase(b.hash);
  b.hashed = false;
  b.hash = 0;
  b.tokens.clear();
}

void BlockPool::lru_push_back(BlockId id) {
  Block& b = blocks_[index(id)];
  b.lru_prev = lru_tail_;
  b.lru_next = kNone;
  if (lru_tail_ != kNone) blocks_[index(lru_tail_)].lru_next = id;
  else lru_head_ = id;
  lru_tail_ = id;
  n_cached_++;
}

void BlockPool::lru_remove(BlockId id) {
  Block& b = blocks_[index(id)];
  if (b.lru_prev != kNone) blocks_[index(b.lru_prev)].lru_next = b.lru_next;
  else lru_head_ = b.lru_next;
  if (b.lru_next != kNone) blocks_[index(b.lru_next)].lru_prev = b.lru_prev;
  else lru_tail_ = b.lru_prev;
  b.lru_prev = b.lru_next = kNone;
  n_cached_--;
}

void BlockPool::check_integrity() const {
  int64_t n_free = 0, n_used = 0, n_cached = 0, n_hashed = 0;
  for (const Block& b : blocks_) {
    check(b.ref_count >= 0, "ref counts are never negative");
    if (b.ref_count > 0) n_used++;
    else if (b.hashed) n_cached++;
    else n_free++;
    n_hashed += b.hashed ? 1 : 0;
  }
  check(n_free == free(), "free blocks are exactly the free stack");
  check(n_cached == cached(), "cached blocks are exactly the LRU list");
  check(n_free + n_used + n_cached == total(), "the pool is conserved");
  check(n_hashed == static_cast<int64_t>(by_hash_.size()), "every hashed block is in the hash map once");
  int64_t walked = 0;
  for (BlockId id = lru_head_; id != kNone; id = blocks_[index(id)].lru_next) {
    check(blocks_[index(id)].ref_count == 0 && blocks_[index(id)].hashed, "the LRU list holds cached blocks only");
    walked++;
  }
  check(walked == n_cached_, "the LRU list length matches its count");
  for (const auto& [hash, id] : by_hash_) check(blocks_[index(id)].hash == hash, "the hash map points at its block");
  for (BlockId id : free_) check(blocks_[index(id)].ref_count == 0 && !blocks_[index(id)].hashed, "free blocks are bare");
}

}  // namespace kvserve
