#pragma once
// Scalar reference (de)quantization of one row, bit-exact with ggml's block
// layouts (see core/dtype.h). These are the ground truth the SIMD kernels
// are tested against.
#include <cstdint>

#include "core/dtype.h"

namespace kvserve {

// dst[0..n) = the n values encoded in src. n is a multiple of the block size.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);
// Encodes n floats as `type`: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 with
// ggml's rounding; q4_k, q5_k, q6_k with a simple min/max rule (valid blocks
// that decode as in ggml, not llama.cpp's searched scales; see quantize_kquants.h);
// iq4_nl / iq4_xs with an importance-free scale search (quantize_iq4.cpp).
void quantize_row(DType type, const float* src, void* dst, int64_t n);
// As quantize_row, but q4_k, q5_k and q6_k search each sub-block's scale for
// the least squared error (several times slower): for model weights.
void quantize_row_searched(DType type, const float* src, void* dst, int64_t n);

}  // namespace kvserve
