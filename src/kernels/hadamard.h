#pragma once
// Walsh-Hadamard rotation of K, V and Q around a quantized KV cache.
//
// An 8-bit block (q8_0: one scale per 32 values) spends its levels on the
// block's largest value; a key with a few large dimensions (Qwen2's K biases,
// turned by RoPE) leaves the other dimensions of its block a handful of
// levels. Rotating each head vector by an orthonormal Hadamard matrix H
// spreads every dimension over the whole block first, so the cache rounds a
// vector of like-sized values. Scores are unchanged, (Hq).(Hk) = q.k, so the
// query is rotated like the keys; the values are rotated before they are
// stored and each head's attention output is rotated back (H is symmetric and
// H H = I). llama.cpp does the same for its quantized K/V cache
// (llama-kv-cache.cpp, "attn_rot_k"): docs/attention.md, "Rotated quantized K/V".
#include <cstdint>

#include "core/kv_type.h"

namespace kvserve {

// x[0..n) rotated in place, block by block: each run of `block` values
// (a power of two, n a multiple of it) becomes H x / sqrt(block), H the
// Sylvester-ordered Hadamard matrix (H[i][j] = (-1)^popcount(i & j)). The fast
// transform: log2(block) passes of sums and differences.
void hadamard_rotate(float* x, int64_t n, int64_t block);

// The same product as a plain matrix-vector product in double, out of place:
// the reference the fast transform is tested against.
void hadamard_rotate_reference(const float* x, float* y, int64_t n, int64_t block);

// The rotation blocks a cache of `type` takes for head vectors of head_dim
// values: q8_0 and q4_0 rotate; the float types (f32, f16, bf16, fp8: each
// value rounded relative to itself) do not.
// Keys: the largest power of two dividing head_dim (one rotation per head
// where the head is a power of two); values: at most 64 (llama.cpp measured
// smaller rotations as better for V). MLA's latent rows hold keys and values
// in one vector, V their first kv_lora_rank values: both use one block that
// divides kv_lora_rank and the row, at most 64.
struct KVRotation {
  int64_t keys = 0;
  int64_t values = 0;
  bool any() const { return keys > 0 || values > 0; }
};
KVRotation kv_rotation(KVType type, int64_t head_dim);
KVRotation mla_kv_rotation(KVType type, int64_t row, int64_t kv_lora_rank);

}  // namespace kvserve
