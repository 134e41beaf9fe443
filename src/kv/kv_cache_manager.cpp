#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace kvserve {
namespace {

void count_references(std::span<const BlockId> table, std::vector<int32_t>& refs) {
  for (BlockId b : table)
    if (b != kNoBlock) refs[static_cast<size_t>(b)]++;
}

void check_references(const BlockPool& pool, const std::vector<int32_t>& refs) {
  pool.check_integrity();
  for (BlockId b = 0; b < pool.total(); ++b)
    check(refs[static_cast<size_t>(b)] == pool.ref_count(b), "ref counts equal the page-table references");
}

}  // namespace

KVCacheManager::KVCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching)
    : pool_(n_blocks, block_size), prefix_caching_(prefix_caching) {}

KVCacheManager::KVCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching,
                               const SlidingKVGroup& sliding)
    : pool_(n_blocks, block_size), prefix_caching_(prefix_caching), window_(sliding.window) {
  if (sliding.window <= 0)
    throw Error("the sliding KV group needs a positive window, got " + std::to_string(sliding.window));
  sliding_pool_.emplace(sliding.n_blocks, block_size);
}

const BlockPool& KVCacheManager::sliding_pool() const {
  check(sliding_pool_.has_value(), "the sliding pool exists only with a sliding group");
  return *sliding_pool_;
}

int64_t KVCacheManager::first_sliding_block(int64_t pos) const {
  return std::max<int64_t>(pos - window_ + 1, 0) / block_size();
}

bool KVCacheManager::sliding_hit(std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                                 int64_t n_blocks) const {
  const int64_t B = block_size();
  for (int64_t i = first_sliding_block(n_blocks * B); i < n_blocks; ++i)
    if (!sliding_pool_->lookup(hashes[static_cast<size_t>(i)], tokens.subspan(static_cast<size_t>(i * B),
                                                                              static_cast<size_t>(B))))
      return false;
  return true;
}

int64_t KVCacheManager::match_prefix(SequenceId seq, std::span<const int32_t> tokens) {
  PageTable& table = tables_[seq];
  check(table.blocks.empty(), "prefix matching starts from an empty page table");
  if (!prefix_caching_ || tokens.empty()) return 0;
  const int64_t B = block_size();
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / B;
  std::vector<uint64_t> hashes;  // of the leading blocks the full group holds
  std::vector<BlockId> hits;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i * B), static_cast<size_t>(B));
    const uint64_t h = hash_block_tokens(parent, block_tokens);
    const std::optional<BlockId> hit = pool_.lookup(h, block_tokens);
    if (!hit) break;
    hits.push_back(*hit);
    hashes.push_back(h);
    parent = h;
  }
  auto n = static_cast<int64_t>(hits.size());
  // The continuation's first queries read the sliding group's last blocks
  // before n: a run whose window blocks were evicted there is cut shorter.
  if (sliding_pool_)
    while (n > 0 && !sliding_hit(tokens, hashes, n)) --n;
  for (int64_t i = 0; i < n; ++i) {
    pool_.retain(hits[static_cast<size_t>(i)]);
    table.blocks.push_back(hits[static_cast<size_t>(i)]);
    table.hashes.push_back(hashes[static_cast<size_t>(i)]);
  }
  if (!sliding_pool_) return n * B;
  table.sliding.assign(static_cast<size_t>(n), kNoBlock);
  for (int64_t i = first_sliding_block(n * B); i < n; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i * B), static_cast<size_t>(B));
    const BlockId id = *sliding_pool_->lookup(hashes[static_cast<size_t>(i)], block_tokens);
    sliding_pool_->retain(id);
    table.sliding[static_cast<size_t>(i)] = id;
  }
  return n * B;
}

int64_t KVCacheManager::blocks_needed(const BlockPool& pool, const std::vector<BlockId>& table, int64_t write_from,
                                      int64_t n_tokens) const {
  const auto have = static_cast<int64_t>(table.size());
  const int64_t want = blocks_for(n_tokens);
  int64_t shared = 0;
  for (int64_t i = write_from / block_size(); i < std::min(have, want); ++i) {
    const BlockId b = table[static_cast<size_t>(i)];
    check(b != kNoBlock, "writes go to blocks after every released one");
    if (pool.ref_count(b) > 1) shared++;
  }
  return std::max<int64_t>(want - have, 0) + shared;
}

void KVCacheManager::grow(BlockPool& pool, std::vector<BlockId>& table, int64_t write_from, int64_t n_tokens,
                          KVGroup group, std::vector<BlockCopy>& copies) {
  const auto have = static_cast<int64_t>(table.size());
  const int64_t want = blocks_for(n_tokens);
  for (int64_t i = write_from / block_size(); i < std::min(have, want); ++i) {
    BlockId& slot = table[static_cast<size_t>(i)];
    if (pool.ref_count(slot) == 1) continue;
    const BlockId copy = *pool.allocate();
    copies.push_back({slot, copy, group});
    pool.release(slot);
    slot = copy;
  }
  for (int64_t i = have; i < want; ++i) table.push_back(*pool.allocate());
  // A copied block is no longer the published one: its hash stays valid (the
  // tokens are the same) and keeps chaining the blocks after it.
}

void KVCacheManager::release_passed(PageTable& table, int64_t pos) {
  const int64_t end = std::min(first_sliding_block(pos), static_cast<int64_t>(table.sliding.size()));
  // Released entries are always a leading run: find where it stops, then
  // release oldest first (evicted first: later prefix hits need later blocks).
  int64_t i = end;
  while (i > 0 && table.sliding[static_cast<size_t>(i - 1)] != kNoBlock) --i;
  for (; i < end; ++i) {
    sliding_pool_->release(table.sliding[static_cast<size_t>(i)]);
    table.sliding[static_cast<size_t>(i)] = kNoBlock;
  }
}

bool KVCacheManager::allocate(SequenceId seq, int64_t write_from, int64_t n_tokens, std::vector<BlockCopy>& copies) {
  PageTable& table = tables_[seq];
  check(write_from >= 0 && write_from <= n_tokens, "writes fall inside the allocated range");
  if (sliding_pool_) release_passed(table, write_from);
  if (blocks_needed(pool_, table.blocks, write_from, n_tokens) > pool_.available()) return false;
  if (sliding_pool_ && blocks_needed(*sliding_pool_, table.sliding, write_from, n_tokens) > sliding_pool_->available())
    return false;
  grow(pool_, table.blocks, write_from, n_tokens, KVGroup::kFull, copies);
  if (sliding_pool_) grow(*sliding_pool_, table.sliding, write_from, n_tokens, KVGroup::kSliding, copies);
  return true;
}

bool KVCacheManager::can_grow(SequenceId seq, int64_t n_tokens, int64_t spare) const {
  const auto it = tables_.find(seq);
  const int64_t have = it == tables_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  const int64_t new_blocks = std::max<int64_t>(blocks_for(n_tokens) - have, 0);
  // Both tables cover the same logical blocks, so both add the same number.
  if (new_blocks + spare > pool_.available()) return false;
  return !sliding_pool_ || new_blocks + spare <= sliding_pool_->available();
}

void KVCacheManager::commit(SequenceId seq, std::span<const int32_t> tokens, int64_t n_computed) {
  if (!prefix_caching_) return;
  PageTable& table = tables_[seq];
  const int64_t B = block_size();
  const int64_t full = std::min<int64_t>(n_computed / B, static_cast<int64_t>(table.blocks.size()));
  check(n_computed <= static_cast<int64_t>(tokens.size()), "computed tokens are known tokens");
  for (auto i = static_cast<int64_t>(table.hashes.size()); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : table.hashes[static_cast<size_t>(i - 1)];
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i * B), static_cast<size_t>(B));
    const uint64_t h = hash_block_tokens(parent, block_tokens);
    pool_.publish(table.blocks[static_cast<size_t>(i)], h, block_tokens);
    if (sliding_pool_ && table.sliding[static_cast<size_t>(i)] != kNoBlock)
      sliding_pool_->publish(table.sliding[static_cast<size_t>(i)], h, block_tokens);
    table.hashes.push_back(h);
  }
}

void KVCacheManager::truncate(SequenceId seq, int64_t n_tokens) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  PageTable& table = it->second;
  const int64_t keep = blocks_for(std::max<int64_t>(n_tokens, 0));
  check(static_cast<int64_t>(table.hashes.size()) * block_size() <= n_tokens, "truncation keeps every published block");
  while (static_cast<int64_t>(table.blocks.size()) > keep) {
    pool_.release(table.blocks.back());
    table.blocks.pop_back();
    if (!sliding_pool_) continue;
    check(table.sliding.back() != kNoBlock, "a rollback never reaches a released sliding block");
    sliding_pool_->release(table.sliding.back());
    table.sliding.pop_back();
  }
}

void KVCacheManager::fork(SequenceId parent, SequenceId child) {
  const auto it = tables_.find(parent);
  check(it != tables_.end(), "fork of a known sequence");
  check(tables_.count(child) == 0 || tables_[child].blocks.empty(), "fork into a new sequence");
  PageTable copy = it->second;
  for (BlockId b : copy.blocks) pool_.retain(b);
  for (BlockId b : copy.sliding)
    if (b != kNoBlock) sliding_pool_->retain(b);
  tables_[child] = std::move(copy);
}

void KVCacheManager::free(SequenceId seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) pool_.release(*b);
  for (auto b = it->second.sliding.rbegin(); b != it->second.sliding.rend(); ++b)
    if (*b != kNoBlock) sliding_pool_->release(*b);
  tables_.erase(it);
}

std::span<const BlockId> KVCacheManager::blocks(SequenceId seq) const {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

std::span<const BlockId> KVCacheManager::sliding_blocks(SequenceId seq) const {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second.sliding;
}

void KVCacheManager::check_integrity() const {
  std::vector<int32_t> refs(static_cast<size_t>(pool_.total()), 0);
  std::vector<int32_t> sliding_refs(sliding_pool_ ? static_cast<size_t>(sliding_pool_->total()) : 0, 0);
  for (const auto& [seq, table] : tables_) {
    check(table.hashes.size() <= table.blocks.size(), "hashes describe leading blocks only");
    check(sliding_pool_ ? table.sliding.size() == table.blocks.size() : table.sliding.empty(),
          "the sliding table covers the same logical blocks");
    for (BlockId b : table.blocks) check(b != kNoBlock, "the full group keeps every block");
    count_references(table.blocks, refs);
    count_references(table.sliding, sliding_refs);
  }
  check_references(pool_, refs);
  if (sliding_pool_) check_references(*sliding_pool_, sliding_refs);
}

}  // namespace kvserve
