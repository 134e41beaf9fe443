#pragma once
// The K/V bytes of the paged cache: per layer, n_blocks physical blocks of
// block_size f32 rows each. Which block belongs to which sequence is the
// KVCacheManager's business; this class only stores rows and copies blocks.
#include <cstdint>

#include "core/aligned_buffer.h"
#include "kv/block_pool.h"

namespace kvserve {

class PagedKVStorage {
 public:
  PagedKVStorage(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t kv_dim);

  // Bytes one block takes across all layers (K and V).
  static int64_t bytes_per_block(int64_t n_layers, int64_t block_size, int64_t kv_dim) {
    return 2 * n_layers * block_size * kv_dim * static_cast<int64_t>(sizeof(float));
  }

  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  float* k_block(int64_t layer, BlockId b) { return k_.data() + offset(layer, b); }  // [block_size][kv_dim]
  float* v_block(int64_t layer, BlockId b) { return v_.data() + offset(layer, b); }  // [block_size][kv_dim]
  const float* k_block(int64_t layer, BlockId b) const { return k_.data() + offset(layer, b); }
  const float* v_block(int64_t layer, BlockId b) const { return v_.data() + offset(layer, b); }
  // Copies block src's rows into block dst in every layer (copy-on-write).
  void copy_block(BlockId src, BlockId dst);
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  size_t offset(int64_t layer, BlockId b) const;
  int64_t n_layers_, n_blocks_, block_size_, kv_dim_;
  AlignedBuffer<float> k_;  // [n_layers][n_blocks][block_size][kv_dim]
  AlignedBuffer<float> v_;  // [n_layers][n_blocks][block_size][kv_dim]
};

}  // namespace kvserve
