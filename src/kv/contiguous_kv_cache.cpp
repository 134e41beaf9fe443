#include "kv/contiguous_kv_cache.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/key_lanes.h"

namespace kvserve {

ContiguousKVCache::ContiguousKVCache(int64_t n_layers, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
                                     KVType type, const SlidingRing& ring, bool values_in_keys)
    : capacity_(capacity), n_kv_heads_(n_kv_heads), head_dim_(head_dim), type_(type), values_in_keys_(values_in_keys) {
  check(n_layers > 0 && capacity > 0 && n_kv_heads > 0 && head_dim > 0, "KV cache dimensions are positive");
  check(ring.layers.empty() || static_cast<int64_t>(ring.layers.size()) == n_layers, "one ring flag per layer");
  require_kv_type_fits(type, head_dim);
  head_bytes_ = kv_head_bytes(type, head_dim);
  static_assert(kBlockTokens % kKeyLanes == 0 && kRingBlock % kKeyLanes == 0, "blocks of whole lane groups");
  keys_in_lanes_ = stores_keys_in_lanes(type, kBlockTokens, values_in_keys);  // the ring's blocks too (above)
  // A ring of R blocks aliases positions R * kRingBlock apart; one block more
  // than window + slack, so a chunk's new rows never land on a key still in view.
  const int64_t ring_blocks = ring.window > 0 ? (ring.window + ring.slack + kRingBlock - 1) / kRingBlock + 1 : 0;
  const bool use_ring = ring_blocks > 0 && ring_blocks * kRingBlock < capacity &&
                        std::find(ring.layers.begin(), ring.layers.end(), true) != ring.layers.end();
  if (use_ring) {
    window_ = ring.window;
    ring_blocks_ = ring_blocks;
    ring_owner_.assign(static_cast<size_t>(ring_blocks * kRingBlock), -1);
  }
  layers_.resize(static_cast<size_t>(n_layers));
  int64_t n_ring_layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) {
    layers_[static_cast<size_t>(l)].ring = use_ring && ring.layers[static_cast<size_t>(l)];
    n_ring_layers += layers_[static_cast<size_t>(l)].ring ? 1 : 0;
  }
  const size_t token_bytes = static_cast<size_t>(n_kv_heads) * head_bytes_;
  const int64_t full_blocks = (capacity + kBlockTokens - 1) / kBlockTokens;
  const size_t full_block_bytes = static_cast<size_t>(kBlockTokens) * token_bytes;  // one layer's block
  const size_t ring_block_bytes = static_cast<size_t>(kRingBlock) * token_bytes;
  const size_t full_stride = static_cast<size_t>(n_layers - n_ring_layers) * full_block_bytes;  // a block, all layers
  const size_t ring_stride = static_cast<size_t>(n_ring_layers) * ring_block_bytes;
  const size_t ring_at = static_cast<size_t>(full_blocks) * full_stride;
  k_.resize(ring_at + static_cast<size_t>(ring_blocks_) * ring_stride);
  if (!values_in_keys) v_.resize(k_.size());
  int64_t full_index = 0, ring_index = 0;  // the layer's place among its kind
  for (Layer& layer : layers_) {
    const int64_t table_blocks = layer.ring ? (capacity + kRingBlock - 1) / kRingBlock : full_blocks;
    for (int64_t b = 0; b < table_blocks; ++b) {
      const size_t at = layer.ring ? ring_at + static_cast<size_t>(b % ring_blocks_) * ring_stride +
                                         static_cast<size_t>(ring_index) * ring_block_bytes
                                   : static_cast<size_t>(b) * full_stride + static_cast<size_t>(full_index) * full_block_bytes;
      layer.k_table.push_back(k_.data() + at);
      layer.v_table.push_back((values_in_keys ? k_.data() : v_.data()) + at);
    }
    ++(layer.ring ? ring_index : full_index);
  }
}

KVRows ContiguousKVCache::rows(int64_t layer, bool keys) const {
  const Layer& l = layers_[static_cast<size_t>(layer)];
  const int64_t block = block_tokens(l);
  const size_t head_stride = static_cast<size_t>(block) * head_bytes_;
  return {type_, block, head_bytes_, (keys ? l.k_table : l.v_table).data(), head_stride, keys && keys_in_lanes_};
}

uint8_t* ContiguousKVCache::token(const std::vector<uint8_t*>& table, int64_t block_tokens, int64_t pos,
                                  size_t head_bytes) {
  return table[static_cast<size_t>(pos / block_tokens)] + static_cast<size_t>(pos % block_tokens) * head_bytes;
}

void ContiguousKVCache::set_size(int64_t n) {
  check(n >= 0 && n <= capacity_, "KV cache size within capacity");
  if (n < size_ && ring_blocks_ > 0) {
    const auto slots = static_cast<int64_t>(ring_owner_.size());
    for (int64_t p = std::max<int64_t>(0, n - window_ + 1); p < n; ++p)
      if (ring_owner_[static_cast<size_t>(p % slots)] != p)
        throw Error("cannot roll the KV cache back to " + std::to_string(n) + " tokens: its sliding-window layers keep "
                    "only the last " + std::to_string(slots) + " positions, and position " + std::to_string(p) +
                    " was overwritten");
  }
  size_ = n;
}

void ContiguousKVCache::write(int64_t layer, int64_t pos, const float* k, const float* v) {
  check(pos >= 0 && pos < capacity_, "KV write within capacity");
  const Layer& l = layers_[static_cast<size_t>(layer)];
  const int64_t block = block_tokens(l);
  const size_t head_stride = static_cast<size_t>(block) * head_bytes_;
  if (keys_in_lanes_) {
    uint8_t* group = token(l.k_table, block, pos - pos % kKeyLanes, head_bytes_);
    quantize_kv_token_lanes(type_, n_kv_heads_, head_dim_, k, group, head_stride, pos % kKeyLanes);
  } else {
    quantize_kv_token(type_, n_kv_heads_, head_dim_, k, token(l.k_table, block, pos, head_bytes_), head_stride);
  }
  if (!values_in_keys_)
    quantize_kv_token(type_, n_kv_heads_, head_dim_, v, token(l.v_table, block, pos, head_bytes_), head_stride);
  if (l.ring) ring_owner_[static_cast<size_t>(pos % static_cast<int64_t>(ring_owner_.size()))] = pos;
}

}  // namespace kvserve
