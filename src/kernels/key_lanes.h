#pragma once
// Keys in lanes: how the caches store f16 / bf16 K and how every attention
// path scores such keys (docs/attention.md, "Keys in lanes").
//
// Inside a block, a head's keys go in groups of kKeyLanes = 16 positions
// (positions 16 g .. 16 g + 15 of the block), each group transposed:
// [head_dim][16 keys], so one 32-byte load gives one dimension of 16 keys.
// q . k for the 16 keys is then head_dim broadcast multiply-adds into one
// register: no horizontal sum per key, and one widening per 16 keys shared by
// every query row. A group takes the bytes of the 16 head vectors it replaces,
// so block sizes, block copies and the KV budget do not change.
//
// The arithmetic (AttentionVectorOps::dot_lanes, kernels/kv_quant.h): a key's
// score is one fused multiply-add per dimension, in dimension order, from 0.
// Every path (decode, prefill, paged, every ISA, rows stored either way) gives
// f16 / bf16 keys these bits, which keeps batch invariance.
#include <cstddef>
#include <cstdint>

#include "kernels/kv_quant.h"

namespace kvserve {

// Whether keys of `type` are scored in lanes (f16, bf16). Their rows may be
// stored either way (KVRows::keys_in_lanes); rows stored one vector per key
// are transposed into lanes as a tile is loaded.
bool scores_in_lanes(KVType type);

// Whether a cache with blocks of block_size tokens stores its K of `type` in
// lanes: f16 / bf16 in blocks of whole groups, and not where V is a view of
// the K rows (MLA's latent rows: V reads them as vectors).
bool stores_keys_in_lanes(KVType type, int64_t block_size, bool values_in_keys);

// Encodes one token's n_heads K vectors ([n_heads * head_dim] floats) into
// lane `lane` of a group: head h's group at group + h * head_stride. The same
// element bits as quantize_kv_token, transposed.
void quantize_kv_token_lanes(KVType type, int64_t n_heads, int64_t head_dim, const float* src, uint8_t* group,
                             size_t head_stride, int64_t lane);

// out[0..head_dim) = lane `lane` of a group of `type` (f16 / bf16) keys.
void dequantize_key_lane(KVType type, const uint8_t* group, int64_t lane, int64_t head_dim, float* out);

// The scalar reference of AttentionVectorOps::dot_lanes: for each row r,
// group g and lane l, out[r][16 g + l] = fma(q[r][d], groups[g][16 d + l], .)
// over d = 0 .. n - 1 in order, starting from 0.
void scalar_dot_lanes(const float* const* q, int n_rows, const float* const* groups, int64_t n_groups, int64_t n,
                      float* const* out);

}  // namespace kvserve
