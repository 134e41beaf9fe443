#pragma once
// The simplest KV storage: per layer, one contiguous array of K and one of V,
// in any KV element type (kernels/kv_quant.h), head-major: head h's vectors of
// positions 0 .. capacity - 1 one after the other (KVRows' layout with one
// block), each quantized on its own. One sequence; capacity fixed at creation.
#include <cstdint>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/kv_quant.h"

namespace kvserve {

class ContiguousKVCache {
 public:
  // Throws kvserve::Error when `type` cannot hold heads of head_dim elements.
  ContiguousKVCache(int64_t n_layers, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
                    KVType type = KVType::F32);

  int64_t capacity() const { return capacity_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  KVType type() const { return type_; }
  // Positions [0, size) hold valid K/V.
  int64_t size() const { return size_; }
  void set_size(int64_t n);
  void clear() { size_ = 0; }

  // Stores one token's K and V ([n_kv_heads * head_dim] floats each) at pos,
  // converted to the cache's type.
  void write(int64_t layer, int64_t pos, const float* k, const float* v);
  // The layer's rows as the attention kernels read them (one block of
  // `capacity` tokens). Valid while the cache lives.
  KVRows k_rows(int64_t layer) const { return rows(k_bases_, layer); }
  KVRows v_rows(int64_t layer) const { return rows(v_bases_, layer); }
  size_t bytes() const { return k_.size() + v_.size(); }

 private:
  KVRows rows(const std::vector<const uint8_t*>& bases, int64_t layer) const {
    return {type_, capacity_, head_bytes_, &bases[static_cast<size_t>(layer)], head_stride()};
  }
  size_t head_stride() const { return static_cast<size_t>(capacity_) * head_bytes_; }
  // Head 0's vector of `pos` in the layer (head h at + h * head_stride()).
  uint8_t* token(AlignedBuffer<uint8_t>& buf, int64_t layer, int64_t pos) {
    return buf.data() + static_cast<size_t>(layer * n_kv_heads_ * capacity_ + pos) * head_bytes_;
  }
  int64_t capacity_, n_kv_heads_, head_dim_;
  KVType type_;
  size_t head_bytes_;
  int64_t size_ = 0;
  AlignedBuffer<uint8_t> k_;  // [n_layers][n_kv_heads][capacity][head_bytes]
  AlignedBuffer<uint8_t> v_;  // [n_layers][n_kv_heads][capacity][head_bytes]
  std::vector<const uint8_t*> k_bases_, v_bases_;  // [n_layers] each layer's first row
};

}  // namespace kvserve
