#include "kv/paged_kv_storage.h"

#include <cstring>

#include "core/error.h"

namespace kvserve {
namespace {

size_t token_row_bytes(int64_t n_kv_heads, int64_t head_dim, KVType type) {
  require_kv_type_fits(type, head_dim);
  return static_cast<size_t>(n_kv_heads) * kv_head_bytes(type, head_dim);
}

}  // namespace

PagedKVStorage::PagedKVStorage(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads,
                               int64_t head_dim, KVType type)
    : n_layers_(n_layers), n_blocks_(n_blocks), block_size_(block_size), n_kv_heads_(n_kv_heads),
      head_dim_(head_dim), type_(type) {
  check(n_layers > 0 && n_blocks > 0 && block_size > 0 && n_kv_heads > 0 && head_dim > 0,
        "paged KV dimensions are positive");
  row_bytes_ = token_row_bytes(n_kv_heads, head_dim, type);
  const auto n = static_cast<size_t>(n_layers * n_blocks * block_size) * row_bytes_;
  k_.resize(n);
  v_.resize(n);
}

int64_t PagedKVStorage::bytes_per_block(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                                        KVType type) {
  return 2 * n_layers * block_size * static_cast<int64_t>(token_row_bytes(n_kv_heads, head_dim, type));
}

size_t PagedKVStorage::offset(int64_t layer, BlockId b) const {
  check(layer >= 0 && layer < n_layers_ && b >= 0 && b < n_blocks_, "paged KV index inside the storage");
  return static_cast<size_t>((layer * n_blocks_ + b) * block_size_) * row_bytes_;
}

void PagedKVStorage::write(int64_t layer, BlockId b, int64_t slot, const float* k, const float* v) {
  check(slot >= 0 && slot < block_size_, "paged KV row inside its block");
  const size_t at = offset(layer, b) + static_cast<size_t>(slot) * row_bytes_;
  quantize_kv_token(type_, n_kv_heads_, head_dim_, k, k_.data() + at);
  quantize_kv_token(type_, n_kv_heads_, head_dim_, v, v_.data() + at);
}

void PagedKVStorage::append_block_bases(int64_t layer, std::span<const BlockId> table,
                                        std::vector<const uint8_t*>& k_bases,
                                        std::vector<const uint8_t*>& v_bases) const {
  for (BlockId b : table) {
    k_bases.push_back(k_block(layer, b));
    v_bases.push_back(v_block(layer, b));
  }
}

void PagedKVStorage::copy_block(BlockId src, BlockId dst) {
  const auto bytes = static_cast<size_t>(block_size_) * row_bytes_;
  for (int64_t l = 0; l < n_layers_; ++l) {
    std::memcpy(k_.data() + offset(l, dst), k_block(l, src), bytes);
    std::memcpy(v_.data() + offset(l, dst), v_block(l, src), bytes);
  }
}

}  // namespace kvserve
