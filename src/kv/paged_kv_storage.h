#pragma once
// The K/V bytes of the paged cache: per layer, n_blocks physical blocks of
// block_size token rows each, in any KV element type (kernels/kv_quant.h).
// A token row holds its n_kv_heads head vectors one after the other, each
// quantized on its own, exactly as in ContiguousKVCache, so the attention
// kernels read both through KVRows. Which block belongs to which sequence is
// the KVCacheManager's business; this class only stores rows and copies
// blocks. With a sliding group (KVCacheManager's), the sliding layers' rows
// live in that group's own blocks: a block id names a block of the layer's
// group. Not thread-safe: owned by the engine thread.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/kv_quant.h"
#include "kv/block_pool.h"
#include "kv/kv_cache_manager.h"

namespace kvserve {

class PagedKVStorage {
 public:
  // Throws kvserve::Error when `type` cannot hold heads of head_dim elements
  // (q8_0, fp8 and q4_0 need head_dim % 32 == 0).
  // values_in_keys (MLA's latent rows): V is a view of each K row, no V bytes are kept.
  PagedKVStorage(int64_t n_layers, int64_t n_blocks, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                 KVType type = KVType::F32, bool values_in_keys = false);

  // Two groups: the layers flagged in layer_is_sliding ([n_layers]) over
  // n_sliding_blocks blocks, the others over n_blocks. Throws like the above.
  PagedKVStorage(const std::vector<bool>& layer_is_sliding, int64_t n_blocks, int64_t n_sliding_blocks,
                 int64_t block_size, int64_t n_kv_heads, int64_t head_dim, KVType type = KVType::F32,
                 bool values_in_keys = false);

  // Bytes one block takes across all layers (K and V); throws like the constructor.
  static int64_t bytes_per_block(int64_t n_layers, int64_t block_size, int64_t n_kv_heads, int64_t head_dim,
                                 KVType type, bool values_in_keys = false);

  int64_t n_blocks() const { return n_blocks_[0]; }
  bool has_sliding_group() const { return n_blocks_[1] > 0; }
  // Whether the layer's rows are in the sliding group (read through a
  // sequence's sliding table); false for every layer without the group.
  bool is_sliding(int64_t layer) const { return group_[static_cast<size_t>(layer)] == KVGroup::kSliding; }
  int64_t block_size() const { return block_size_; }
  KVType type() const { return type_; }
  // Bytes of one token's K (or V) row in one layer.
  size_t row_bytes() const { return row_bytes_; }

  // Stores one token's K and V ([n_kv_heads * head_dim] floats each) in row
  // `slot` of block b, converted to the storage type (v unused, may be null,
  // when values are in the keys).
  void write(int64_t layer, BlockId b, int64_t slot, const float* k, const float* v);
  // Appends the base addresses of the table's blocks in one layer to k_bases
  // and v_bases (for rows()): nullptr for a kNoBlock entry, whose rows no
  // query reads.
  void append_block_bases(int64_t layer, std::span<const BlockId> table, std::vector<const uint8_t*>& k_bases,
                          std::vector<const uint8_t*>& v_bases) const;
  // K or V rows through block base addresses in position order, which must outlive the result.
  // A block is head-major: [n_kv_heads][block_size][head bytes] (KVRows), its
  // K in lanes where keys_in_lanes() (f16 / bf16 in blocks of whole lane groups, without MLA).
  KVRows k_rows(const uint8_t* const* bases) const {
    return {type_, block_size_, head_bytes_, bases, head_stride(), keys_in_lanes_};
  }
  KVRows v_rows(const uint8_t* const* bases) const { return {type_, block_size_, head_bytes_, bases, head_stride()}; }
  bool keys_in_lanes() const { return keys_in_lanes_; }
  const uint8_t* k_block(int64_t layer, BlockId b) const { return k_.data() + offset(layer, b); }
  const uint8_t* v_block(int64_t layer, BlockId b) const {
    return (values_in_keys_ ? k_.data() : v_.data()) + offset(layer, b);
  }
  bool values_in_keys() const { return values_in_keys_; }
  // Copies block src's rows into block dst in every layer of the group, byte for byte (copy-on-write).
  void copy_block(BlockId src, BlockId dst, KVGroup group = KVGroup::kFull);
  size_t bytes() const { return k_.size() + v_.size(); }
  // Bytes one block of the group takes across its layers (K and V).
  int64_t block_bytes(KVGroup group) const;

 private:
  size_t offset(int64_t layer, BlockId b) const;
  int64_t n_layers_, block_size_, n_kv_heads_, head_dim_;
  std::array<int64_t, 2> n_blocks_ = {0, 0};  // per group (KVGroup order); 0 sliding blocks: no sliding group
  KVType type_;
  bool values_in_keys_ = false;
  bool keys_in_lanes_ = false;
  size_t row_bytes_;   // one token's K (or V) in one layer, all heads
  size_t head_bytes_;  // one head vector
  size_t head_stride() const { return static_cast<size_t>(block_size_) * head_bytes_; }
  std::vector<KVGroup> group_;          // [n_layers] each layer's group
  std::vector<int64_t> index_in_group_; // [n_layers] the layer's index among its group's layers
  std::array<int64_t, 2> layers_in_group_ = {0, 0};
  std::array<size_t, 2> group_offset_ = {0, 0};  // bytes before each group's rows
  // Each group's layers one after the other: [group][layer in group][block][n_kv_heads][block_size][head bytes]
  AlignedBuffer<uint8_t> k_;
  AlignedBuffer<uint8_t> v_;  // empty when values are in the keys
};

}  // namespace kvserve
