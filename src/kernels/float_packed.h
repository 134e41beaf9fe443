#pragma once
// Float weights (f32, f16, bf16) repacked once at load for a register-blocked
// GEMM: rows interleaved by 8, so that one 256-bit register holds one column
// of 8 rows (8 floats, or 8 halves / bfloats widened exactly to floats) and
// every lane of a multiply-add belongs to one row.
//
// Activations stay exact f32 (no rounding to 8 or 16 bits): for float weights
// there is no integer dot to feed, and an f32 FMA per weight costs the same
// whether x was rounded or not. So float weights compute the same thing in
// both activation modes (kernels/dispatch.h); only quantized weights round x.
//
// The arithmetic of every (row, token) is one chain, fixed by the shape:
//   acc = 0; for k = 0 .. cols - 1: acc = fma(w[row][k], x[token][k], acc)
// whatever the number of tokens in the call (decode, verification, prefill
// tiles), the cache blocking over k (the chain is stored and reloaded between
// k blocks, which changes no bit) or the number of threads. That makes float
// models batch-invariant, and matmul_float_reference() computes exactly this
// from the original rows (the SIMD kernels must match it bit for bit).
//
// Layout: rows padded to a multiple of 8 (padding rows are zero); row group g
// (rows 8g .. 8g + 7) is float_packed_group_bytes() long, holding for each
// column k the 8 rows' values in the weight type (f32: 32 bytes, f16 / bf16:
// 16 bytes), column after column. Same bytes per weight as the GGUF rows: the
// copy costs no memory beyond the padding rows once the mapped originals are
// dropped (Model::repack_matrices).
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kvserve {

// f32, f16 and bf16: the types repack_float_rows8() takes.
bool float_weight_type(DType type);

// Bytes of one row group (8 rows x cols values) and of the whole packed matrix.
size_t float_packed_group_bytes(DType type, int64_t cols);
size_t float_packed_matrix_bytes(DType type, int64_t rows, int64_t cols);

// Writes w (a float weight type) in the layout above into dst
// (float_packed_matrix_bytes(...) bytes). Throws kvserve::Error for other types.
void repack_float_rows8(const TensorView& w, uint8_t* dst);

// Whether the active kernel table has the packed float kernels (AVX2 and
// AVX-512 do; scalar keeps reading the original rows).
bool float_packed_kernels_active();

// The chain above for every (row, token), from the original rows, in plain
// C++ (std::fma). Single-threaded; the SIMD kernels match it bitwise.
void matmul_float_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace kvserve
