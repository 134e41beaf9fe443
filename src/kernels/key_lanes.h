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

// q8_0 keys in lanes (scored with 8-bit integer dot products, the query
// quantized to 8 bits once per row): a group of 16 keys holds, for each
// 32-element block b of the head vector, the 16 keys' f16 scales, then 8
// quads of 4 elements, each [16 keys][4 elements] as unsigned bytes
// k + 128 (VNNI's vpdpbusd takes its unsigned operand first; the row's
// 128 * sum(q) comes off once per block). kQ8LaneBlockBytes per block: the
// bytes of the 16 q8_0 blocks it replaces.
constexpr int64_t kQ8LaneScaleBytes = kKeyLanes * 2;
constexpr int64_t kQ8LaneBlockBytes = kQ8LaneScaleBytes + kKeyLanes * 32;
static_assert(kQ8LaneBlockBytes == kKeyLanes * 34, "a q8_0 lane block takes 16 q8_0 blocks' bytes");

// The step of a quantized query's second part, relative to its first's.
constexpr float kQueryLowStep = 1.0f / 128.0f;

// Quantizes n floats (n a multiple of 32) into a QueryQ8's arrays (kv_quant.h): q / d / sum hold 2 n, n / 32 and
// 2 n / 32 entries, of which `parts` (1 or 2) parts are written. One scalar routine for every ISA, so every path
// scores with the same q.
void quantize_query_q8(const float* x, int64_t n, int parts, int8_t* q, float* d, int32_t* sum);

// Whether keys of `type` are scored in lanes (f16, bf16, q8_0). Their rows may be
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

// Rewrites kKeyLanes q8_0 vectors (rows[l] for lane l; a null row gives a zero
// key) as one lane group at `group` (16 * kv_head_bytes(Q8_0, head_dim) bytes).
void transpose_q8_rows_into_lanes(const uint8_t* const* rows, int64_t head_dim, uint8_t* group);

// out[0..head_dim) = lane `lane` of a group of `type` (f16 / bf16 / q8_0) keys.
void dequantize_key_lane(KVType type, const uint8_t* group, int64_t lane, int64_t head_dim, float* out);

// The scalar reference of AttentionVectorOps::dot_lanes: for each row r,
// group g and lane l, out[r][16 g + l] = fma(q[r][d], groups[g][16 d + l], .)
// over d = 0 .. n - 1 in order, starting from 0.
void scalar_dot_lanes(const float* const* q, int n_rows, const float* const* groups, int64_t n_groups, int64_t n,
                      float* const* out);

// The scalar reference of AttentionVectorOps::dot_lanes_q8: for each row r,
// q8_0 lane group g and lane l, out[r][16 g + l] = over blocks b in order
// from 0: acc = fma(float(hi_b), d_k * d[b], acc), then acc =
// fma(float(lo_b), d_k * (d[b] / 128), acc), where hi_b and lo_b are the exact
// integer dots of the block's 32 key elements with the query's two parts and
// d_k is the key's block scale (the second fma only where q[r].parts == 2).
void scalar_dot_lanes_q8(const QueryQ8* q, int n_rows, const uint8_t* const* groups, int64_t n_groups, int64_t n,
                         float* const* out);

}  // namespace kvserve
