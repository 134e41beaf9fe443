#pragma once
// The shape of a model's K/V cache as kv/ sizes and stores it: plain numbers,
// so that kv/ needs nothing of model/ (ModelConfig::kv_shape() gives a loaded
// model's).
#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvserve {

struct KVShape {
  int64_t n_layers = 0;
  std::vector<bool> layer_is_sliding;  // [n_layers] when sliding_window > 0
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // keys a sliding layer's query sees; 0: no sliding layers
  int64_t context_length = 0;
  // > 0: multi-head latent attention (MLA). Each token and layer caches one
  // row of head_dim = kv_lora_rank + RoPE dims (n_kv_heads 1), and V is a
  // view of that row, so the storage keeps no separate V.
  int64_t kv_lora_rank = 0;

  bool values_in_keys() const { return kv_lora_rank > 0; }

  int64_t n_sliding_layers() const {
    return static_cast<int64_t>(std::count(layer_is_sliding.begin(), layer_is_sliding.end(), true));
  }
};

}  // namespace kvserve
