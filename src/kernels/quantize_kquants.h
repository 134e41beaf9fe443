#pragma once
// Scalar reference (de)quantization of single blocks of Q5_0, Q5_1, IQ4_NL,
// IQ4_XS and the K-quants (Q2_K..Q6_K), bit-exact with ggml's block layouts (see
// core/dtype.h). dequantize_row() in quantize.h and the scalar kernels are
// built on these.
//
// The quantizers are simple (min/max per sub-block, nearest rounding), not
// llama.cpp's search for the best scales: they exist to make valid random
// blocks for tests and `kvserve synth`, and decode exactly as ggml would.
#include <cstdint>

#include "core/dtype.h"

namespace kvserve {

void dequantize_block_q5_0(const BlockQ5_0& b, float* y);  // y[32]
void dequantize_block_q5_1(const BlockQ5_1& b, float* y);  // y[32]
void dequantize_block_iq4_nl(const BlockIQ4_NL& b, float* y);  // y[32]
void dequantize_block_iq4_xs(const BlockIQ4_XS& b, float* y);  // y[256]
void dequantize_block_q2_k(const BlockQ2_K& b, float* y);  // y[256]
void dequantize_block_q3_k(const BlockQ3_K& b, float* y);  // y[256]
void dequantize_block_q4_k(const BlockQ4_K& b, float* y);  // y[256]
void dequantize_block_q5_k(const BlockQ5_K& b, float* y);  // y[256]
void dequantize_block_q6_k(const BlockQ6_K& b, float* y);  // y[256]

void quantize_block_q5_0(const float* x, BlockQ5_0& b);  // x[32]
// ggml's quantize_row_q5_1_ref: d = (max - min) / 31, m = min.
void quantize_block_q5_1(const float* x, BlockQ5_1& b);  // x[32]
// Importance-free: the best of a few scales, each refit by least squares (quantize_iq4.cpp).
void quantize_block_iq4_nl(const float* x, BlockIQ4_NL& b);  // x[32]
void quantize_block_iq4_xs(const float* x, BlockIQ4_XS& b);  // x[256]
// Range / max|x| rules per 16 values (quantize_q23_k.cpp).
void quantize_block_q2_k(const float* x, BlockQ2_K& b);  // x[256]
void quantize_block_q3_k(const float* x, BlockQ3_K& b);  // x[256]
void quantize_block_q4_k(const float* x, BlockQ4_K& b);  // x[256]
void quantize_block_q5_k(const float* x, BlockQ5_K& b);  // x[256]
void quantize_block_q6_k(const float* x, BlockQ6_K& b);  // x[256]

// The same layouts with each sub-block's scale (and min) searched for the
// least squared error instead of taken from its range: slower, for
// `kvserve quantize` (model weights), where the error is what matters.
void quantize_block_q4_k_searched(const float* x, BlockQ4_K& b);  // x[256]
void quantize_block_q5_k_searched(const float* x, BlockQ5_K& b);  // x[256]
void quantize_block_q6_k_searched(const float* x, BlockQ6_K& b);  // x[256]

// Packs eight 6-bit (scale, min) pairs into the 12-byte form that
// kquant_scale_min() reads.
void pack_kquant_scales(const uint8_t scale[8], const uint8_t min[8], uint8_t* packed);

// The unsigned 4/5-bit q of Q4_K/Q5_K value i (0..255), before scaling.
int q4_k_value(const BlockQ4_K& b, int i);
int q5_k_value(const BlockQ5_K& b, int i);
// The unsigned 6-bit q (0..63) of Q6_K value i; w = d * scales[i / 16] * (q - 32).
int q6_k_value(const BlockQ6_K& b, int i);
// The unsigned 5-bit q (0..31) of Q5_0 value i; w = d * (q - 16).
int q5_0_value(const BlockQ5_0& b, int i);
// The unsigned 5-bit q (0..31) of Q5_1 value i; w = d * q + m.
int q5_1_value(const BlockQ5_1& b, int i);
// The 4-bit index (0..15) of IQ4_NL value i; w = d * kIQ4NLValues[index].
int iq4_nl_index(const BlockIQ4_NL& b, int i);
// The 4-bit index of IQ4_XS value i (0..255); w = d * iq4_xs_scale(b, i / 32) * kIQ4NLValues[index].
int iq4_xs_index(const BlockIQ4_XS& b, int i);
// The unsigned 2-bit q (0..3) of Q2_K value i; w = d * (scales[i / 16] & 15) * q - dmin * (scales[i / 16] >> 4).
int q2_k_value(const BlockQ2_K& b, int i);
// The signed q (-4..3) of Q3_K value i; w = d * q3_k_scale(b.scales, i / 16) * q.
int q3_k_value(const BlockQ3_K& b, int i);

}  // namespace kvserve
