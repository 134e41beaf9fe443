#pragma once
// KV-cache element types: how one head's K or V vector is stored, and the
// row (de)quantizers the cache writer and the attention kernels use.
//
// Layouts of one head vector of head_dim elements:
//   f32, f16, bf16  plain arrays.
//   q8_0            GGUF q8_0 blocks (kvserve::BlockQ8_0: fp16 scale, 32 int8).
//   q4_0            GGUF q4_0 blocks (kvserve::BlockQ4_0: fp16 scale, 32 nibbles).
//   fp8             Fp8Block: a power-of-two scale 2^(e - 127) in one byte (an
//                   E8M0 exponent, as in the OCP MX formats) and 32 e4m3 values.
//                   33 bytes per 32 elements, the size kv_planner budgets.
//                   With the scale a power of two, x / scale is exact, so the
//                   only rounding is e4m3's own (relative error <= 2^-4).
// The block types need head_dim % 32 == 0 (require_kv_type_fits throws otherwise).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/kv_type.h"

namespace kvserve {

constexpr int kFp8BlockElems = 32;
struct Fp8Block {
  uint8_t scale_exp;  // scale = 2^(scale_exp - 127)
  uint8_t q[kFp8BlockElems];  // e4m3 codes
};
static_assert(sizeof(Fp8Block) == 33);

// OCP "E4M3FN": 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
// S.1111.111 is NaN; largest finite 448, smallest subnormal 2^-9.
// Encoding rounds to nearest even, saturates finite and infinite values beyond
// +-448 to +-448, and maps NaN to 0x7f (sign kept).
uint8_t f32_to_e4m3(float x);
float e4m3_to_f32(uint8_t code);

// Bytes of one head vector of head_dim elements stored as `type`.
size_t kv_head_bytes(KVType type, int64_t head_dim);
// Whether `type` can hold vectors of head_dim elements (block types need
// whole 32-element blocks).
bool kv_type_fits(KVType type, int64_t head_dim);
// Throws kvserve::Error naming the type and head size, and the types that work.
void require_kv_type_fits(KVType type, int64_t head_dim);

// Encodes n floats (n a multiple of the type's block) into dst.
void quantize_kv_row(KVType type, const float* src, uint8_t* dst, int64_t n);
// Encodes one token's n_heads head vectors ([n_heads * head_dim] floats),
// each head on its own, head h at dst + h * head_stride (KVRows' layout).
void quantize_kv_token(KVType type, int64_t n_heads, int64_t head_dim, const float* src, uint8_t* dst,
                       size_t head_stride);
// dst[0..n) = the values in src: the scalar reference.
void dequantize_kv_row_scalar(KVType type, const uint8_t* src, float* dst, int64_t n);
// Same result, on the fastest path this CPU and the active kernel ISA allow.
void dequantize_kv_row(KVType type, const uint8_t* src, float* dst, int64_t n);

// K or V rows of one layer of one sequence, stored in blocks of block_size
// tokens, through a block table (the contiguous cache's blocks of 256, or 64 in
// a sliding layer's ring; a paged cache's pages; one block for a plain array). Head h of the token at `pos` is at
// head(pos, h). The caches store a block head-major ([head][token][head
// bytes]: token_stride one head vector, head_stride block_size of them), so
// decode attention, which reads one head's keys in order, streams contiguous
// memory (a token-major row made it stride over the other heads' bytes:
// 30% slower at 4096 keys, docs/attention.md). The caches' f16 / bf16 K goes
// further: keys_in_lanes, each group of kKeyLanes positions of a block
// transposed (kernels/key_lanes.h).
constexpr int64_t kKeyLanes = 16;
struct KVRows {
  KVType type = KVType::F32;
  int64_t block_size = 0;           // tokens per block
  size_t token_stride = 0;          // bytes from one token's head vector to the next token's inside a block; a
                                    // multiple of 4 (blocks 4-byte aligned) so f32 / fp16 fields load aligned
  const uint8_t* const* blocks = nullptr;  // block base addresses in position order
  size_t head_stride = 0;           // bytes from head h's vector of a token to head h + 1's
  // K stored in lanes (key_lanes.h; block_size a multiple of kKeyLanes): the
  // group holding `pos` takes the bytes of its 16 vectors, starting at
  // head(pos - pos % kKeyLanes, h); head(pos, h) is then no vector of pos.
  bool keys_in_lanes = false;

  const uint8_t* token(int64_t pos) const {
    return blocks[pos / block_size] + static_cast<size_t>(pos % block_size) * token_stride;
  }
  const uint8_t* head(int64_t pos, int64_t h) const { return token(pos) + static_cast<size_t>(h) * head_stride; }
  const uint8_t* lane_group(int64_t pos, int64_t h) const { return head(pos - pos % kKeyLanes, h); }
};

// Materializes rows [0, n_kv) as f32 [n_kv][n_kv_heads * head_dim], either
// layout (for the reference attention and tests; the flash kernel never does this).
void dequantize_kv_rows(const KVRows& rows, int64_t n_kv, int64_t n_kv_heads, int64_t head_dim, float* out);

// A query row of n elements quantized for q8_0 keys in lanes (key_lanes.h),
// in two 8-bit parts: per 32-element block b, step d[b] = max|x| / 127,
// q[i] = round(x / d[b]) in [-127, 127] (entries 0 .. n), then the remainder
// in steps of d[b] / 128, q[n + i] in [-64, 64]: about 15 bits of the query,
// so its rounding is far below the keys' own. sum[b] and sum[n / 32 + b] are
// the two parts' sums over the block. parts == 1: the first part only (8
// bits), enough where the keys are stored Hadamard-rotated (their values
// spread evenly, so the keys' own rounding dominates; docs/attention.md); the
// second part's entries are then left unset and unread. Every row of one
// dot_lanes_q8 call has the same parts.
struct QueryQ8 {
  const int8_t* q;
  const float* d;
  const int32_t* sum;
  int parts = 2;
};

// Small f32 vector ops of the attention inner loop, SIMD where available.
// dot: sum a[i] * b[i]; axpy: y[i] += a * x[i]; scale: y[i] *= a.
struct AttentionVectorOps {
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  void (*scale)(float a, float* y, int64_t n);
  void (*dequantize)(KVType type, const uint8_t* src, float* dst, int64_t n);
  // For up to kAttentionRowsPerCall query rows r reading the same keys:
  // out[r][j] = dot(q[r], k[j], n) for j < n_keys, and
  // y[r] += p[r][j] v[j] for j = 0, 1, .. in order: the same bits as dot and
  // axpy per row and key (a row's arithmetic never depends on the others in
  // the call), with each key's vector loaded once for all rows and the rows'
  // outputs held in registers across the keys.
  void (*dot_keys)(const float* const* q, int n_rows, const float* const* k, int64_t n_keys, int64_t n, float* const* out);
  void (*axpy_keys)(const float* const* p, int n_rows, const float* const* v, int64_t n_keys, float* const* y, int64_t n);
  // One row of a tile's scores: x[j] *= scale, returning the largest; then
  // x[j] = exp(x[j] - shift) (fast_exp.h), returning their sum.
  float (*scale_max)(float* x, int64_t n, float scale);
  float (*exp_sum)(float* x, int64_t n, float shift);
  // axpy_keys over f16 or bf16 rows (`type`), widened as they load: the bits
  // of dequantizing the rows first and calling axpy_keys (the widening is
  // exact), without the copy. Null where the ISA has none (the caller then
  // dequantizes). (f16 / bf16 K are scored in lanes: dot_lanes_half.)
  void (*axpy_keys_half)(KVType type, const float* const* p, int n_rows, const uint16_t* const* v, int64_t n_keys,
                         float* const* y, int64_t n) = nullptr;
  // Scores of keys in lanes (key_lanes.h): groups[g] holds kKeyLanes keys as
  // [n][kKeyLanes] floats; out[r][16 g + l] = q[r] . key l of group g, one
  // fused multiply-add per dimension in order from 0: the same bits on every
  // ISA and for any group count (scalar_dot_lanes is the reference). The _half
  // form reads f16 / bf16 groups widened as they load (the same bits; null
  // where the ISA has none: the caller widens into f32 groups first).
  void (*dot_lanes)(const float* const* q, int n_rows, const float* const* groups, int64_t n_groups, int64_t n,
                    float* const* out) = nullptr;
  void (*dot_lanes_half)(KVType type, const float* const* q, int n_rows, const uint16_t* const* groups,
                         int64_t n_groups, int64_t n, float* const* out) = nullptr;
  // Scores of q8_0 keys in lanes against quantized query rows: integer dot
  // products per 32-element block, folded in block order (scalar_dot_lanes_q8
  // is the reference: the same bits on every ISA).
  void (*dot_lanes_q8)(const QueryQ8* q, int n_rows, const uint8_t* const* groups, int64_t n_groups, int64_t n,
                       float* const* out) = nullptr;
  // axpy_keys over q8_0 rows, widened as they load: the bits of dequantizing
  // the rows first and calling axpy_keys. Null where the ISA has none.
  void (*axpy_keys_q8)(const float* const* p, int n_rows, const uint8_t* const* v, int64_t n_keys, float* const* y,
                       int64_t n) = nullptr;
};
constexpr int kAttentionRowsPerCall = 4;

// f(std::integral_constant<int, n_rows>{}) for n_rows in 1..kAttentionRowsPerCall:
// how the SIMD tables reach their row-count templates.
template <typename F>
void with_attention_rows(int n_rows, F&& f) {
  static_assert(kAttentionRowsPerCall == 4);
  switch (n_rows) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}
// The row-count dispatch and the one-row cases a SIMD table builds on: K has
// static member templates dot_rows<kRows>(q, k, n_keys, n, out) and
// axpy_rows<kRows>(p, v, n_keys, y, n) (AttentionVectorOps' dot_keys and
// axpy_keys for a fixed row count). dot and axpy are their one-row, one-key
// calls, so dot_keys / axpy_keys give the same bits per row by construction.
template <typename K>
struct AttentionRowOps {
  static void dot_keys(const float* const* q, int n_rows, const float* const* k, int64_t n_keys, int64_t n,
                       float* const* out) {
    with_attention_rows(n_rows, [&](auto rows) { K::template dot_rows<decltype(rows)::value>(q, k, n_keys, n, out); });
  }
  static void axpy_keys(const float* const* p, int n_rows, const float* const* v, int64_t n_keys, float* const* y,
                        int64_t n) {
    with_attention_rows(n_rows, [&](auto rows) { K::template axpy_rows<decltype(rows)::value>(p, v, n_keys, y, n); });
  }
  static float dot(const float* a, const float* b, int64_t n) {
    float out;
    float* const o = &out;
    K::template dot_rows<1>(&a, &b, 1, n, &o);
    return out;
  }
  static void axpy(float a, const float* x, float* y, int64_t n) {
    const float* const p = &a;
    K::template axpy_rows<1>(&p, &x, 1, &y, n);
  }
};

// AttentionVectorOps' axpy_keys_half for a SIMD table: F16 and BF16 are its
// row kernels (axpy_rows, as AttentionRowOps' K) over f16 and bf16 rows,
// picked by the rows' type.
template <typename F16, typename BF16>
struct HalfAttentionRowOps {
  static void axpy_keys_half(KVType type, const float* const* p, int n_rows, const uint16_t* const* v,
                             int64_t n_keys, float* const* y, int64_t n) {
    with_attention_rows(n_rows, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      if (type == KVType::BF16) BF16::template axpy_rows<kRows>(p, v, n_keys, y, n);
      else F16::template axpy_rows<kRows>(p, v, n_keys, y, n);
    });
  }
};

// AttentionVectorOps' dot_lanes / dot_lanes_half for a SIMD table: F32, F16
// and BF16 are its lane kernels over groups of that element type, each with
// a static member template dot_rows<kRows>(q, groups, n_groups, n, out).
template <typename F32, typename F16, typename BF16>
struct LaneAttentionRowOps {
  static void dot_lanes(const float* const* q, int n_rows, const float* const* groups, int64_t n_groups, int64_t n,
                        float* const* out) {
    with_attention_rows(n_rows, [&](auto rows) {
      F32::template dot_rows<decltype(rows)::value>(q, groups, n_groups, n, out);
    });
  }
  static void dot_lanes_half(KVType type, const float* const* q, int n_rows, const uint16_t* const* groups,
                             int64_t n_groups, int64_t n, float* const* out) {
    with_attention_rows(n_rows, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      if (type == KVType::BF16) BF16::template dot_rows<kRows>(q, groups, n_groups, n, out);
      else F16::template dot_rows<kRows>(q, groups, n_groups, n, out);
    });
  }
};

// The ops for the active kernel ISA (kernels/dispatch.h).
const AttentionVectorOps& attention_vector_ops();
const AttentionVectorOps& scalar_attention_vector_ops();

}  // namespace kvserve
