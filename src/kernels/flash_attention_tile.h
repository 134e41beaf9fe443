#pragma once
// Internal to the attention kernels (flash_attention.cpp, paged_attention.cpp):
// the tile loop of flash attention for one work item, so that the paged
// kernel walks block tables with the very same code. Not a public interface.
#include <cstdint>
#include <vector>

#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/kv_quant.h"

namespace kvserve::flash_detail {

// Keys per tile: each tile costs a pass of pointer setup, a max, a rescale
// per row; 256 (one key split) took a fifth off decode attention against 64
// (docs/attention.md), and a 256 x head_dim f32 K tile still fits L2.
constexpr int64_t kKeyTile = 256;
// Query positions per prefill work item: each item dequantizes (f16, bf16,
// q8_0, ...) every key tile it reads once for all its rows, so bigger items
// dequantize less per row; smaller ones keep the threads busy on short chunks.
constexpr int64_t kMinQueryTile = 16, kMaxQueryTile = 64;
// The largest tile in [kMinQueryTile, kMaxQueryTile] (halving) that still
// gives every thread 4 items; any choice gives the same bits (rows are
// independent), so it is a speed choice only.
int64_t query_tile(int64_t n_q, int64_t n_kv_heads, int64_t threads);
// Keys per split, at fixed absolute positions [s * kKeySplit, (s + 1) * kKeySplit):
// every path computes a row's attention split by split, each from a fresh
// online-softmax state, and merges the splits' partial states in split order.
// Decode hands splits to threads; prefill walks them in order inside one work
// item; both run the same arithmetic, so a row's output depends only on its
// query, its position and the K/V rows it sees (batch invariance: not on the
// chunk size, pos0, the threads, the other jobs, or which path ran).
constexpr int64_t kKeySplit = 256;

// One tile of keys of one head. V (and K of the types scored by one dot per
// key: f32, q8_0, fp8, q4_0) as f32 rows: pointers straight into the cache for
// f32 storage, else into this thread's dequantization buffer; or, for f16 /
// bf16 V where the ISA widens them as it loads (AttentionVectorOps' _half
// ops), pointers to the stored rows themselves. f16 / bf16 K as groups of
// kKeyLanes keys in lanes (key_lanes.h): the stored groups, widened as they
// load, or f32 groups widened (or transposed from vectors) into k_lanes_buf.
struct KVTile {
  static constexpr int64_t kGroups = kKeyTile / kKeyLanes;
  std::vector<float> k_buf, v_buf;  // [kKeyTile][head_dim]
  const float* k[kKeyTile];
  const float* v[kKeyTile];
  bool v_half = false;  // v_half_rows hold the V rows (of type v_type), not v
  KVType v_type = KVType::F16;
  const uint16_t* v_half_rows[kKeyTile];
  bool v_q8 = false;  // v_q8_rows hold the q8_0 V rows, not v
  const uint8_t* v_q8_rows[kKeyTile];
  bool k_lanes = false;       // K is scored in lanes: k_group / k_group_half, not k
  bool k_lanes_half = false;  // k_group_half holds the stored groups (of type k_type), not k_group
  KVType k_type = KVType::F16;
  std::vector<float> k_lanes_buf;  // [kGroups][head_dim][kKeyLanes]
  const float* k_group[kGroups];
  const uint16_t* k_group_half[kGroups];
  bool k_lanes_q8 = false;  // k_group_q8 holds q8_0 groups (stored, or transposed into k_q8_buf)
  const uint8_t* k_group_q8[kGroups];
  std::vector<uint8_t> k_q8_buf;
};

// Query rows quantized for q8_0 keys (kv_quant.h's QueryQ8), with the
// arrays they point into. Every path quantizes a row's query with this, so
// its scores do not depend on the path.
struct QuantizedQueries {
  std::vector<QueryQ8> rows;    // [n]
  std::vector<int8_t> values;   // [n][2 * head_dim]
  std::vector<float> scales;    // [n][head_dim / 32]
  std::vector<int32_t> sums;    // [n][2 * head_dim / 32]
  void quantize(const float* const* q, int64_t n, int64_t head_dim, int parts);
};

// Query rows of one work item, all reading the same K/V head.
struct RowBlock {
  int64_t n_rows = 0;
  std::vector<const float*> q;  // [n_rows] -> head_dim floats
  std::vector<int64_t> pos;     // [n_rows] the row's position (sees keys <= pos)
  std::vector<int64_t> first;   // [n_rows] the first key it sees (sliding window; else 0)
  std::vector<OnlineSoftmax> state;  // [n_rows] over the current key split
  std::vector<float> acc;            // [n_rows][head_dim] unnormalized output of the current split
  std::vector<OnlineSoftmax> merged;  // [n_rows] the splits before it, merged in order
  std::vector<float> merged_acc;      // [n_rows][head_dim]
  // When K is q8_0: the rows quantized ([n_rows]), in own_q8 or, for
  // decode, in the call's set quantized once per K/V head; else null.
  const QueryQ8* q8 = nullptr;
  QuantizedQueries own_q8;
};

// One thread's buffers for flash_query_tile (reused across work items).
struct FlashScratch {
  RowBlock rows;
  KVTile tile;
};

// Attention of query positions [i0, i1) of one sequence (query i at position
// pos0 + i, row i of q / out with n_heads * head_dim floats) over K/V head
// kv_head: every query head of the GQA group, keys up to pos0 + i1 - 1 read
// from k / v one tile at a time. Writes those heads' output rows in out.
void flash_query_tile(const float* q, int64_t i0, int64_t i1, int64_t pos0, const KVRows& k, const KVRows& v,
                      int64_t kv_head, const AttentionShape& s, FlashScratch& scratch, float* out);

// Throws kvserve::Error for head counts that do not divide, a KV type that
// cannot hold the head size, or rows without a block table.
void validate_attention(const KVRows& k, const KVRows& v, int64_t n_kv, const AttentionShape& s);

}  // namespace kvserve::flash_detail
