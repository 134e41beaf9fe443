#include "kv/contiguous_kv_cache.h"

#include "core/error.h"

namespace kvserve {

ContiguousKVCache::ContiguousKVCache(int64_t n_layers, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
                                     KVType type)
    : capacity_(capacity), n_kv_heads_(n_kv_heads), head_dim_(head_dim), type_(type) {
  check(n_layers > 0 && capacity > 0 && n_kv_heads > 0 && head_dim > 0, "KV cache dimensions are positive");
  require_kv_type_fits(type, head_dim);
  head_bytes_ = kv_head_bytes(type, head_dim);
  const size_t layer_bytes = static_cast<size_t>(n_kv_heads * capacity) * head_bytes_;
  k_.resize(static_cast<size_t>(n_layers) * layer_bytes);
  v_.resize(static_cast<size_t>(n_layers) * layer_bytes);
  for (int64_t l = 0; l < n_layers; ++l) {
    k_bases_.push_back(k_.data() + static_cast<size_t>(l) * layer_bytes);
    v_bases_.push_back(v_.data() + static_cast<size_t>(l) * layer_bytes);
  }
}

void ContiguousKVCache::set_size(int64_t n) {
  check(n >= 0 && n <= capacity_, "KV cache size within capacity");
  size_ = n;
}

void ContiguousKVCache::write(int64_t layer, int64_t pos, const float* k, const float* v) {
  check(pos >= 0 && pos < capacity_, "KV write within capacity");
  quantize_kv_token(type_, n_kv_heads_, head_dim_, k, token(k_, layer, pos), head_stride());
  quantize_kv_token(type_, n_kv_heads_, head_dim_, v, token(v_, layer, pos), head_stride());
}

}  // namespace kvserve
