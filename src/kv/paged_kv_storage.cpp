#include "kv/paged_kv_storage.h"

#include <cstring>

#include "core/error.h"

namespace kvserve {

PagedKVStorage::PagedKVStorage(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t kv_dim)
    : n_layers_(n_layers), n_blocks_(n_blocks), block_size_(block_size), kv_dim_(kv_dim) {
  check(n_layers > 0 && n_blocks > 0 && block_size > 0 && kv_dim > 0, "paged KV dimensions are positive");
  const auto n = static_cast<size_t>(n_layers * n_blocks * block_size * kv_dim);
  k_.resize(n);
  v_.resize(n);
}

size_t PagedKVStorage::offset(int64_t layer, BlockId b) const {
  check(layer >= 0 && layer < n_layers_ && b >= 0 && b < n_blocks_, "paged KV index inside the storage");
  return static_cast<size_t>(((layer * n_blocks_ + b) * block_size_) * kv_dim_);
}

void PagedKVStorage::copy_block(BlockId src, BlockId dst) {
  const auto bytes = static_cast<size_t>(block_size_ * kv_dim_) * sizeof(float);
  for (int64_t l = 0; l < n_layers_; ++l) {
    std::memcpy(k_block(l, dst), k_block(l, src), bytes);
    std::memcpy(v_block(l, dst), v_block(l, src), bytes);
  }
}

}  // namespace kvserve
