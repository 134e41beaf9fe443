#include "kernels/key_lanes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"

namespace kvserve {

bool scores_in_lanes(KVType type) { return type == KVType::F16 || type == KVType::BF16 || type == KVType::Q8_0; }

namespace {

// Where element i (of 32) of lane `lane` sits in a q8_0 lane block's quads.
int64_t q8_lane_byte(int64_t i, int64_t lane) {
  return kQ8LaneScaleBytes + (i / 4) * kKeyLanes * 4 + lane * 4 + i % 4;
}

// Lane `lane` of q8_0 block b of a group: its scale and its 32 elements.
void put_q8_lane(const BlockQ8_0& block, uint8_t* lane_block, int64_t lane) {
  std::memcpy(lane_block + lane * 2, &block.d, 2);
  for (int64_t i = 0; i < kQK8_0; ++i) lane_block[q8_lane_byte(i, lane)] = static_cast<uint8_t>(block.qs[i] + 128);
}

BlockQ8_0 get_q8_lane(const uint8_t* lane_block, int64_t lane) {
  BlockQ8_0 block;
  std::memcpy(&block.d, lane_block + lane * 2, 2);
  for (int64_t i = 0; i < kQK8_0; ++i) block.qs[i] = static_cast<int8_t>(lane_block[q8_lane_byte(i, lane)] - 128);
  return block;
}

void quantize_q8_token_lanes(int64_t n_heads, int64_t head_dim, const float* src, uint8_t* group, size_t head_stride,
                             int64_t lane) {
  BlockQ8_0 block;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t b = 0; b < head_dim / kQK8_0; ++b) {
      quantize_kv_row(KVType::Q8_0, src + h * head_dim + b * kQK8_0, reinterpret_cast<uint8_t*>(&block), kQK8_0);
      put_q8_lane(block, group + static_cast<size_t>(h) * head_stride + b * kQ8LaneBlockBytes, lane);
    }
}

}  // namespace

void quantize_query_q8(const float* x, int64_t n, int parts, int8_t* q, float* d, int32_t* sum) {
  const int64_t n_blocks = n / kQK8_0;
  const bool two_parts = parts == 2;
  const auto round_to = [](float v) { return static_cast<int8_t>(std::clamp(std::lrintf(v), -127L, 127L)); };
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * kQK8_0;
    float amax = 0.0f;
    for (int64_t i = 0; i < kQK8_0; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float step = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t high = 0, low = 0;
    for (int64_t i = 0; i < kQK8_0; ++i) {
      const int8_t h = round_to(xb[i] * inv);
      q[b * kQK8_0 + i] = h;
      high += h;
      if (!two_parts) continue;
      const int8_t l = round_to((xb[i] - h * step) * inv * 128.0f);
      q[n + b * kQK8_0 + i] = l;
      low += l;
    }
    d[b] = step;
    sum[b] = high;
    if (two_parts) sum[n_blocks + b] = low;
  }
}

void transpose_q8_rows_into_lanes(const uint8_t* const* rows, int64_t head_dim, uint8_t* group) {
  for (int64_t b = 0; b < head_dim / kQK8_0; ++b)
    for (int64_t l = 0; l < kKeyLanes; ++l) {
      BlockQ8_0 block{};
      if (rows[l]) std::memcpy(&block, rows[l] + b * sizeof(BlockQ8_0), sizeof(BlockQ8_0));
      put_q8_lane(block, group + b * kQ8LaneBlockBytes, l);
    }
}

bool stores_keys_in_lanes(KVType type, int64_t block_size, bool values_in_keys) {
  return scores_in_lanes(type) && block_size % kKeyLanes == 0 && !values_in_keys;
}

void quantize_kv_token_lanes(KVType type, int64_t n_heads, int64_t head_dim, const float* src, uint8_t* group,
                             size_t head_stride, int64_t lane) {
  if (type == KVType::Q8_0) return quantize_q8_token_lanes(n_heads, head_dim, src, group, head_stride, lane);
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
  if (type == KVType::Q8_0) {
    for (int64_t b = 0; b < head_dim / kQK8_0; ++b) {
      const BlockQ8_0 block = get_q8_lane(group + b * kQ8LaneBlockBytes, lane);
      dequantize_kv_row_scalar(KVType::Q8_0, reinterpret_cast<const uint8_t*>(&block), out + b * kQK8_0, kQK8_0);
    }
    return;
  }
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

void scalar_dot_lanes_q8(const QueryQ8* q, int n_rows, const uint8_t* const* groups, int64_t n_groups, int64_t n,
                         float* const* out) {
  const int64_t n_blocks = n / kQK8_0;
  for (int r = 0; r < n_rows; ++r) {
    const bool two_parts = q[r].parts == 2;
    for (int64_t g = 0; g < n_groups; ++g)
      for (int64_t l = 0; l < kKeyLanes; ++l) {
        float acc = 0.0f;
        for (int64_t b = 0; b < n_blocks; ++b) {
          const uint8_t* block = groups[g] + b * kQ8LaneBlockBytes;
          uint16_t dk;
          std::memcpy(&dk, block + l * 2, 2);
          int32_t high = 0, low = 0;
          for (int64_t i = 0; i < kQK8_0; ++i) {
            const int32_t k = block[q8_lane_byte(i, l)];
            high += k * q[r].q[b * kQK8_0 + i];
            if (two_parts) low += k * q[r].q[n + b * kQK8_0 + i];
          }
          high -= 128 * q[r].sum[b];
          const float scale = fp16_to_f32(dk);
          acc = std::fma(static_cast<float>(high), scale * q[r].d[b], acc);
          if (!two_parts) continue;
          low -= 128 * q[r].sum[n_blocks + b];
          acc = std::fma(static_cast<float>(low), scale * (q[r].d[b] * kQueryLowStep), acc);
        }
        out[r][g * kKeyLanes + l] = acc;
      }
  }
}

}  // namespace kvserve
