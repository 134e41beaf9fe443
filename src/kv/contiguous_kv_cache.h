#pragma once
// The simplest KV storage: per layer, one contiguous f32 array of K rows and
// one of V rows, indexed by position. One sequence; capacity fixed at creation.
#include <cstdint>

#include "core/aligned_buffer.h"

namespace kvserve {

class ContiguousKVCache {
 public:
  ContiguousKVCache(int64_t n_layers, int64_t capacity, int64_t kv_dim);

  int64_t capacity() const { return capacity_; }
  int64_t kv_dim() const { return kv_dim_; }
  // Positions [0, size) hold valid K/V.
  int64_t size() const { return size_; }
  void set_size(int64_t n);
  void clear() { size_ = 0; }

  float* k(int64_t layer, int64_t pos) { return k_.data() + offset(layer, pos); }  // [kv_dim]
  float* v(int64_t layer, int64_t pos) { return v_.data() + offset(layer, pos); }  // [kv_dim]
  const float* k(int64_t layer, int64_t pos) const { return k_.data() + offset(layer, pos); }
  const float* v(int64_t layer, int64_t pos) const { return v_.data() + offset(layer, pos); }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  size_t offset(int64_t layer, int64_t pos) const {
    return static_cast<size_t>((layer * capacity_ + pos) * kv_dim_);
  }
  int64_t capacity_, kv_dim_;
  int64_t size_ = 0;
  AlignedBuffer<float> k_;  // [n_layers][capacity][kv_dim]
  AlignedBuffer<float> v_;  // [n_layers][capacity][kv_dim]
};

}  // namespace kvserve
