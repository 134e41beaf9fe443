#include "kernels/key_lanes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"

namespace kvserve {

bool scores_in_lanes(KVType type) { return type == KVType::F16 || type == KVType::BF16; }

bool stores_keys_in_lanes(KVType type, int64_t block_size, bool values_in_keys) {
  return scores_in_lanes(type) && block_size % kKeyLanes == 0 && !values_in_keys;
}

void quantize_kv_token_lanes(KVType type, int64_t n_heads, int64_t head_dim, const float* src, uint8_t* group,
                             size_t head_stride, int64_t lane) {
  constexpr int64_t kChunk = 64;  // elements encoded at a time, then scattered to their lanes
  uint16_t encoded[kChunk];
  for (int64_t h = 0; h < n_heads; ++h) {
    auto* dst = reinterpret_cast<uint16_t*>(group + static_cast<size_t>(h) * head_stride) + lane;
    for (int64_t d0 = 0; d0 < head_dim; d0 += kChunk) {
      const int64_t n = std::min(kChunk, head_dim - d0);
      quantize_kv_row(type, src + h * head_dim + d0, reinterpret_cast<uint8_t*>(encoded), n);
      for (int64_t i = 0; i < n; ++i) dst[(d0 + i) * kKeyLanes] = encoded[i];
    }
  }
}

void dequantize_key_lane(KVType type, const uint8_t* group, int64_t lane, int64_t head_dim, float* out) {
  const auto* src = reinterpret_cast<const uint16_t*>(group) + lane;
  for (int64_t d = 0; d < head_dim; ++d) {
    const uint16_t x = src[d * kKeyLanes];
    out[d] = type == KVType::BF16 ? bf16_to_f32(x) : fp16_to_f32(x);
  }
}

void scalar_dot_lanes(const float* const* q, int n_rows, const float* const* groups, int64_t n_groups, int64_t n,
                      float* const* out) {
  for (int r = 0; r < n_rows; ++r)
    for (int64_t g = 0; g < n_groups; ++g)
      for (int64_t l = 0; l < kKeyLanes; ++l) {
        float acc = 0.0f;
        for (int64_t d = 0; d < n; ++d) acc = std::fma(q[r][d], groups[g][d * kKeyLanes + l], acc);
        out[r][g * kKeyLanes + l] = acc;
      }
}

}  // namespace kvserve
