#include "kv/contiguous_kv_cache.h"

#include "core/error.h"

namespace kvserve {

ContiguousKVCache::ContiguousKVCache(int64_t n_layers, int64_t capacity, int64_t kv_dim)
    : capacity_(capacity), kv_dim_(kv_dim) {
  check(n_layers > 0 && capacity > 0 && kv_dim > 0, "KV cache dimensions are positive");
  k_.resize(static_cast<size_t>(n_layers * capacity * kv_dim));
  v_.resize(static_cast<size_t>(n_layers * capacity * kv_dim));
}

void ContiguousKVCache::set_size(int64_t n) {
  check(n >= 0 && n <= capacity_, "KV cache size within capacity");
  size_ = n;
}

}  // namespace kvserve
