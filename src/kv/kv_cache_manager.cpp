#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

KVCacheManager::KVCacheManager(int64_t n_blocks, int64_t block_size, bool prefix_caching)
    : pool_(n_blocks, block_size), prefix_caching_(prefix_caching) {}

int64_t KVCacheManager::match_prefix(SequenceId seq, std::span<const int32_t> tokens) {
  PageTable& table = tables_[seq];
  check(table.blocks.empty(), "prefix matching starts from an empty page table");
  if (!prefix_caching_ || tokens.empty()) return 0;
  const int64_t B = block_size();
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / B;
  uint64_t parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(i * B), static_cast<size_t>(B));
    const uint64_t h = hash_block_tokens(parent, block_tokens);
    const std::optional<BlockId> hit = pool_.lookup(h, block_tokens);
    if (!hit) break;
    pool_.retain(*hit);
    table.blocks.push_back(*hit);
    table.hashes.push_back(h);
    parent = h;
  }
  return static_cast<int64_t>(table.blocks.size()) * B;
}

bool KVCacheManager::allocate(SequenceId seq, int64_t write_from, int64_t n_tokens, std::vector<BlockCopy>& copies) {
  PageTable& table = tables_[seq];
  check(write_from >= 0 && write_from <= n_tokens, "writes fall inside the allocated range");
  const auto have = static_cast<int64_t>(table.blocks.size());
  const int64_t want = blocks_for(n_tokens);
  int64_t shared = 0;
  for (int64_t i = write_from / block_size(); i < std::min(have, want); ++i)
    if (pool_.ref_count(table.blocks[static_cast<size_t>(i)]) > 1) shared++;
  if (std::max<int64_t>(want - have, 0) + shared > pool_.available()) return false;
  for (int64_t i = write_from / block_size(); i < std::min(have, want); ++i) {
    BlockId& slot = table.blocks[static_cast<size_t>(i)];
    if (pool_.ref_count(slot) == 1) continue;
    const BlockId copy = *pool_.allocate();
    copies.push_back({slot, copy});
    pool_.release(slot);
    slot = copy;
  }
  for (int64_t i = have; i < want; ++i) table.blocks.push_back(*pool_.allocate());
  // A copied block is no longer the published one: its hash stays valid (the
  // tokens are the same) and keeps chaining the blocks after it.
  return true;
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
  }
}

void KVCacheManager::fork(SequenceId parent, SequenceId child) {
  const auto it = tables_.find(parent);
  check(it != tables_.end(), "fork of a known sequence");
  check(tables_.count(child) == 0 || tables_[child].blocks.empty(), "fork into a new sequence");
  PageTable copy = it->second;
  for (BlockId b : copy.blocks) pool_.retain(b);
  tables_[child] = std::move(copy);
}

void KVCacheManager::free(SequenceId seq) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) pool_.release(*b);
  tables_.erase(it);
}

std::span<const BlockId> KVCacheManager::blocks(SequenceId seq) const {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

void KVCacheManager::check_integrity() const {
  pool_.check_integrity();
  std::vector<int32_t> refs(static_cast<size_t>(pool_.total()), 0);
  for (const auto& [seq, table] : tables_) {
    check(table.hashes.size() <= table.blocks.size(), "hashes describe leading blocks only");
    for (BlockId b : table.blocks) refs[static_cast<size_t>(b)]++;
  }
  for (BlockId b = 0; b < pool_.total(); ++b)
    check(refs[static_cast<size_t>(b)] == pool_.ref_count(b), "ref counts equal the page-table references");
}

}  // namespace kvserve
