#include "kv/paged_kv_storage.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/key_lanes.h"

namespace kvserve {
namespace {

size_t token_row_bytes(int64_t n_kv_heads, int64_t head_dim, KVType type) {
  require_kv_type_fits(type, head_dim);
  return static_cast<size_t>(n_kv_heads) * kv_head_bytes(type, head_dim);
}

size_t group_index(KVGroup g) { return g == KVGroup::kFull ? 0 : 1; }

}  // namespace

PagedKVStorage::PagedKVStorage(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                               int64_t head_dim, KVType type, bool values_in_keys)
    : PagedKVStorage(std::vector<bool>(static_cast<size_t>(std::max<int64_t>(n_layers, 0)), false), n_blocks, 0,
                     block_size, n_kv_heads, head_dim, type, values_in_keys) {}

PagedKVStorage::PagedKVStorage(const std::vector<bool>& layer_is_sliding, int64_t n_blocks, int64_t n_sliding_blocks,
                               int64_t block_size, int64_t n_kv_heads, int64_t head_dim, KVType type,
                               bool values_in_keys)
    : n_layers_(static_cast<int64_t>(layer_is_sliding.size())), block_size_(block_size), n_kv_heads_(n_kv_heads),
      head_dim_(head_dim), n_blocks_{n_blocks, n_sliding_blocks}, type_(type), values_in_keys_(values_in_keys) {
  check(n_layers_ > 0 && n_blocks > 0 && n_sliding_blocks >= 0 && block_size > 0 && n_kv_heads > 0 && head_dim > 0,
        "paged KV dimensions are positive");
  row_bytes_ = token_row_bytes(n_kv_heads, head_dim, type);
  head_bytes_ = kv_head_bytes(type, head_dim);
  keys_in_lanes_ = stores_keys_in_lanes(type, block_size, values_in_keys);
  for (bool sliding : layer_is_sliding) {
    const KVGroup g = sliding && n_sliding_blocks > 0 ? KVGroup::kSliding : KVGroup::kFull;
    group_.push_back(g);
    index_in_group_.push_back(layers_in_group_[group_index(g)]++);
  }
  const size_t layer_block_bytes = static_cast<size_t>(block_size) * row_bytes_;
  group_offset_[1] = static_cast<size_t>(layers_in_group_[0] * n_blocks_[0]) * layer_block_bytes;
  const size_t n = group_offset_[1] + static_cast<size_t>(layers_in_group_[1] * n_blocks_[1]) * layer_block_bytes;
  k_.resize(n);
  if (!values_in_keys) v_.resize(n);
}

int64_t PagedKVStorage::bytes_per_block(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                                        KVType type, bool values_in_keys) {
  return (values_in_keys ? 1 : 2) * n_layers * block_size * static_cast<int64_t>(token_row_bytes(n_kv_heads, head_dim, type));
}

int64_t PagedKVStorage::block_bytes(KVGroup group) const {
  return (values_in_keys_ ? 1 : 2) * layers_in_group_[group_index(group)] * block_size_ * static_cast<int64_t>(row_bytes_);
}

size_t PagedKVStorage::offset(int64_t layer, BlockId b) const {
  check(layer >= 0 && layer < n_layers_, "paged KV layer inside the storage");
  const size_t g = group_index(group_[static_cast<size_t>(layer)]);
  check(b >= 0 && b < n_blocks_[g], "paged KV block inside its group");
  const int64_t in_group = index_in_group_[static_cast<size_t>(layer)];
  return group_offset_[g] + static_cast<size_t>((in_group * n_blocks_[g] + b) * block_size_) * row_bytes_;
}

void PagedKVStorage::write(int64_t layer, BlockId b, int64_t slot, const float* k, const float* v) {
  check(slot >= 0 && slot < block_size_, "paged KV row inside its block");
  const size_t at = offset(layer, b) + static_cast<size_t>(slot) * head_bytes_;
  if (keys_in_lanes_) {
    const size_t group = offset(layer, b) + static_cast<size_t>(slot - slot % kKeyLanes) * head_bytes_;
    quantize_kv_token_lanes(type_, n_kv_heads_, head_dim_, k, k_.data() + group, head_stride(), slot % kKeyLanes);
  } else {
    quantize_kv_token(type_, n_kv_heads_, head_dim_, k, k_.data() + at, head_stride());
  }
  if (!values_in_keys_) quantize_kv_token(type_, n_kv_heads_, head_dim_, v, v_.data() + at, head_stride());
}

void PagedKVStorage::append_block_bases(int64_t layer, std::span<const BlockId> table,
                                        std::vector<const uint8_t*>& k_bases,
                                        std::vector<const uint8_t*>& v_bases) const {
  for (BlockId b : table) {
    k_bases.push_back(b == kNoBlock ? nullptr : k_block(layer, b));
    v_bases.push_back(b == kNoBlock ? nullptr : v_block(layer, b));
  }
}

void PagedKVStorage::copy_block(BlockId src, BlockId dst, KVGroup group) {
  const auto bytes = static_cast<size_t>(block_size_) * row_bytes_;
  for (int64_t l = 0; l < n_layers_; ++l) {
    if (group_[static_cast<size_t>(l)] != group) continue;
    std::memcpy(k_.data() + offset(l, dst), k_block(l, src), bytes);
    if (!values_in_keys_) std::memcpy(v_.data() + offset(l, dst), v_block(l, src), bytes);
  }
}

}  // namespace kvserve
