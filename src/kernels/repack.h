#pragma once
// Weights repacked once at load for the 8-bit-activation kernels: rows
// interleaved by 8, so that one 256-bit register holds 4 consecutive values of
// 8 rows and every 32-bit lane of an integer dot product belongs to one row.
// A (row, token) sum then never crosses lanes: it is an exact integer dot per
// block followed by one fixed chain of float multiply-adds over the blocks in
// order, the same for one token (decode), a few (speculative verification) or
// hundreds (prefill), on any number of threads. That is what makes results
// batch-invariant, and what matmul_q8_reference() computes in plain C++ from
// the original GGUF blocks (the SIMD kernels must match it bit for bit).
//
// Layout (all types): rows padded to a multiple of 8 (padding rows are zero);
// row group g (rows 8g..8g+7) is packed_group_bytes() long, holding its
// super-blocks (32 values for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL, 256 for the K-quants
// and IQ4_XS) in
// order. Inside a super-block, every 32-value sub-block j stores its values as
// chunks c = 0..7 of 32 bytes: byte 4r + k is row r's value 32j + 4c + k.
//  - 4-bit planes (all but Q8_0): 128 bytes per sub-block; register p = 0..3
//    holds chunk 2p in its low nibbles and chunk 2p + 1 in its high nibbles
//    (IQ4_NL / IQ4_XS: indices into kIQ4NLValues, the kernels look the levels up).
//  - Q5_0 / Q5_1 / Q5_K fifth bits: 32 bytes per sub-block; bit c of byte 4r + k is
//    the fifth bit of chunk c's byte 4r + k.
//  - Q6_K top two bits: 64 bytes per sub-block; chunks 0..3 in the first 32
//    bytes, 4..7 in the next, bits 2(c % 4), 2(c % 4) + 1 of byte 4r + k.
//  - Q8_0: 256 bytes of the values biased to unsigned (q + 128, i.e. q xor
//    0x80), chunk c at 32c: VNNI's vpdpbusd takes them as they are.
// Super-block headers (per row r, 8 entries each):
//  Q4_0 / Q5_0 / Q8_0: fp16 d[8].               w = d (q - 8), d (q - 16), d q
//  IQ4_NL:             fp16 d[8].               w = d kIQ4NLValues[q]
//  Q4_1 / Q5_1:        fp16 d[8], fp16 m[8].    w = d q + m
//  Q4_K / Q5_K:        fp16 d[8], fp16 -dmin[8], u8 scale[8 sub-blocks][8 rows],
//                      u8 min[8][8].            w = d scale_j q - dmin min_j
//  Q6_K:               fp16 d[8], i8 scale[16 groups of 16][8 rows].
//                                               w = d scale_g (q - 32)
//  IQ4_XS:             fp16 d[8], i8 scale[8 sub-blocks][8 rows] (ls - 32).
//                                               w = d scale_j kIQ4NLValues[q]
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kvserve {

// Whether the active kernel table (kernels/dispatch.h) has packed kernels
// (AVX2 and AVX-512 do, scalar does not): only then is repacking worth it.
bool packed_kernels_active();

// Whether repack_rows8() takes this weight type.
bool packable_type(DType type);

// Bytes of one row group (8 rows x cols values) and of the whole packed matrix.
size_t packed_group_bytes(DType type, int64_t cols);
size_t packed_matrix_bytes(DType type, int64_t rows, int64_t cols);

// Writes w (a packable type with whole super-blocks per row) in the layout
// above into dst (packed_matrix_bytes(...) bytes). Throws kvserve::Error for
// other types or shapes.
void repack_rows8(const TensorView& w, uint8_t* dst);

// ---- Activations, quantized once per token per matmul -----------------------
// Blocks of 32 (for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL): one float scale
// for the 32 values, refined per 16-value half h by a power of two as the
// 256-value blocks' sub-blocks are (below; a third less KL divergence from
// exact activations on SmolLM2: docs/performance.md). With m = max|x| over the
// 32 and m_h over half h, half h quantizes with step (m / 127) / 2^k_h;
// stored: d = m / 127 / 8 and shift[h] = 3 - k_h (packed_act_shift), so x ~= d
// (q << shift[h]). A kernel shifts each half's integer dot left by shift[h]
// before adding them. sum = the sum of q << shift[h] over the 32 (|sum| <= 32
// x 127 x 8), s = d * sum (what Q4_1's / Q5_1's m multiplies).
struct PackedAct32 {
  float d;
  float s;
  int32_t sum;
  int32_t shift[2];  // 0..3; int32 so that a kernel loads it straight into a shift count
  int32_t unused[3];
};
// 32 bytes per 32 values: the kernels find a block's record at one fixed offset
// from its values (packed_simd.h, group_tokens).
static_assert(sizeof(PackedAct32) == 32);
// Super-blocks of 256 (for the K-quants and IQ4_XS): one float scale for the 256
// values, refined per 32-value sub-block j by a power of two. With m = max|x|
// over the 256 and m_j over sub-block j, k_j is the largest k in 0..3 with
// m_j 2^k <= m; sub-block j quantizes with step (m / 127) / 2^k_j, so a
// sub-block far below the block's outlier keeps up to 3 more bits (the
// ffn_down input of GELU/SiLU models: docs/performance.md). Stored: d = m / 127
// / 8 and shift[j] = 3 - k_j, so x ~= d (q << shift[j]); a kernel shifts the
// integer dot of sub-block j left by shift[j] and multiplies the sum by d. The
// sums of q over each 16 and each 32 values (what the mins / the Q6_K bias
// multiply) are stored already shifted (|sum32| <= 32 x 127 x 8 = 32512).
struct PackedAct256 {
  int16_t sum16[16];
  int16_t sum32[8];
  int32_t shift[8];  // 0..3; int32 so that a kernel loads it straight into a shift count
  float d;
  float unused[3];
};
static_assert(sizeof(PackedAct256) == 96);

// Sub-block j's shift[j] (above; PackedAct32: half h's) from its max|x| and the
// block's: 3 - k for the largest k in 0..3 with sub_max 2^k <= block_max (0 for
// an all-zero sub-block).
inline int32_t packed_act_shift(float sub_max, float block_max) {
  int k = 0;
  while (k < 3 && sub_max * static_cast<float>(2 << k) <= block_max) ++k;
  return 3 - k;
}
// The scale of a block from its parts' max|x| (PackedAct32: two halves,
// PackedAct256: eight sub-blocks): writes the stored d (= max / 127 / 8) and
// each part's shift, and returns 1 / (max / 127) (0 for an all-zero block),
// the factor every quantizer of these records rounds x 2^k by.
inline float packed_act_scale(const float* part_max, int n_parts, float* stored_d, int32_t* shifts) {
  float block_max = 0;
  for (int j = 0; j < n_parts; ++j) block_max = std::max(block_max, part_max[j]);
  const float d = block_max / 127.0f;
  *stored_d = d * 0.125f;
  for (int j = 0; j < n_parts; ++j) shifts[j] = packed_act_shift(part_max[j], block_max);
  return d != 0 ? 1.0f / d : 0.0f;
}
// v x 2^shift: an integer dot or sum of sub-block j at the super-block's scale.
inline int32_t at_block_scale(int32_t v, int32_t shift) { return v * (1 << shift); }

// Whether a packed type's activations come in super-blocks of 256.
bool packed_act_is_256(DType type);
// Bytes of one token's activations: qs (packed_act_qs_bytes: cols bytes, padded
// to 64), then one PackedAct32 per 32 or PackedAct256 per 256 values; a multiple of 64.
size_t packed_act_row_bytes(DType type, int64_t cols);
size_t packed_act_qs_bytes(int64_t cols);
// Quantizes one token: per block of 32 or 256 values, q = round((x 2^k) / (max|x|
// / 127)) with the refinements above. With SIMD
// kernels active the AVX2 loop, else the scalar one; both write the same bytes.
void quantize_packed_activations(DType type, const float* x, int64_t cols, uint8_t* dst);
void quantize_packed_activations_scalar(DType type, const float* x, int64_t cols, uint8_t* dst);
#if KVSERVE_HAVE_SIMD
void quantize_packed_activations_avx2(DType type, const float* x, int64_t cols, uint8_t* dst);
#endif

struct PackedActRow {
  const int8_t* qs;
  const void* blocks;  // PackedAct32[cols / 32] or PackedAct256[cols / 256]
};
PackedActRow packed_act_row(const uint8_t* row, int64_t cols);

// The arithmetic every packed kernel performs, from the original GGUF blocks:
// activations quantized as above, an exact integer dot per super-block, then
// per (row, token) acc = fma(float(isum), d_w * d_x, acc) (+ the offset term)
// over the super-blocks in order. Single-threaded; the SIMD kernels match it
// bitwise.
void matmul_q8_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace kvserve
