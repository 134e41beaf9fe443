#include "kernels/hadamard.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "core/error.h"

namespace kvserve {
namespace {

void require_rotation_shape(int64_t n, int64_t block) {
  if (block < 1 || !std::has_single_bit(static_cast<uint64_t>(block)) || n % block != 0)
    throw Error("hadamard_rotate: the block must be a power of two dividing n, got block " + std::to_string(block) +
                " for n " + std::to_string(n));
}

// The largest power of two dividing n (n > 0).
int64_t power_of_two_part(int64_t n) { return n & -n; }

// The integer-grid types, whose step is set by the block's largest value. Not fp8: its error is relative to
// each value, and a rotation spreads a large key dimension's size over all of them (Qwen2.5-Coder-0.5B at 4K,
// KL from f16: 0.051 as stored, 0.545 rotated; docs/attention.md).
bool rotates(KVType type) { return type == KVType::Q8_0 || type == KVType::Q4_0; }

}  // namespace

void hadamard_rotate(float* x, int64_t n, int64_t block) {
  require_rotation_shape(n, block);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  for (int64_t base = 0; base < n; base += block) {
    float* v = x + base;
    // Pass h pairs each value with the one h further on: (a, b) -> (a + b, a - b).
    for (int64_t h = 1; h < block; h *= 2)
      for (int64_t i = 0; i < block; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    for (int64_t j = 0; j < block; ++j) v[j] *= scale;
  }
}

void hadamard_rotate_reference(const float* x, float* y, int64_t n, int64_t block) {
  require_rotation_shape(n, block);
  const double scale = 1.0 / std::sqrt(static_cast<double>(block));
  for (int64_t base = 0; base < n; base += block)
    for (int64_t i = 0; i < block; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < block; ++j) {
        const bool negative = std::popcount(static_cast<uint64_t>(i & j)) % 2 == 1;
        sum += negative ? -static_cast<double>(x[base + j]) : static_cast<double>(x[base + j]);
      }
      y[base + i] = static_cast<float>(sum * scale);
    }
}

KVRotation kv_rotation(KVType type, int64_t head_dim) {
  if (!rotates(type) || head_dim <= 0) return {};
  const int64_t keys = power_of_two_part(head_dim);
  return {keys, std::min<int64_t>(keys, 64)};
}

KVRotation mla_kv_rotation(KVType type, int64_t row, int64_t kv_lora_rank) {
  if (!rotates(type) || row <= 0 || kv_lora_rank <= 0) return {};
  const int64_t block = std::min<int64_t>({power_of_two_part(row), power_of_two_part(kv_lora_rank), 64});
  return {block, block};
}

}  // namespace kvserve
