// IQ4_NL / IQ4_XS (de)quantization, bit-exact with ggml's decoding
// (dequantize_row_iq4_nl / _iq4_xs). The quantizer is importance-free: for a
// few candidate scales around max|x| / 127, every value is rounded to its
// nearest level, the scale refit by least squares, and the candidate with the
// least squared error kept (llama.cpp's quantizer weighs the error by x^2 or an
// importance matrix; this one weighs every value the same).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "kernels/quantize_kquants.h"

namespace kvserve {
namespace {

// The index of the level nearest to v (kIQ4NLValues is ascending).
int nearest_iq4_index(float v) {
  int best = 0;
  float best_error = std::fabs(v - kIQ4NLValues[0]);
  for (int i = 1; i < 16; ++i) {
    const float e = std::fabs(v - kIQ4NLValues[i]);
    if (e < best_error) {
      best = i;
      best_error = e;
    }
  }
  return best;
}

// Scale and level indices of n values x ~= scale * kIQ4NLValues[index].
// Candidates map the value of largest magnitude to the extreme level (-127
// when it is positive, as ggml does: d = max / -127 puts it there) and to
// levels near it; each is refit by least squares over its rounded indices.
float fit_iq4_scale(const float* x, int n, uint8_t* index) {
  float max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(max)) max = x[i];
  for (int i = 0; i < n; ++i) index[i] = 8;  // level 1: the all-zero block's indices
  if (max == 0) return 0.0f;
  float best_scale = 0, best_error = INFINITY;
  uint8_t trial[kQK_K];
  for (int step = -7; step <= 7; ++step) {
    const float inverse = (static_cast<float>(kIQ4NLValues[0]) + static_cast<float>(step)) / max;
    float qx = 0, qq = 0;
    for (int i = 0; i < n; ++i) {
      trial[i] = static_cast<uint8_t>(nearest_iq4_index(inverse * x[i]));
      const float q = kIQ4NLValues[trial[i]];
      qx += q * x[i];
      qq += q * q;
    }
    const float scale = qq > 0 ? qx / qq : 0.0f;
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float e = x[i] - scale * static_cast<float>(kIQ4NLValues[trial[i]]);
      error += e * e;
    }
    if (error < best_error) {
      best_error = error;
      best_scale = scale;
      std::memcpy(index, trial, static_cast<size_t>(n));
    }
  }
  return best_scale;
}

// Re-rounds x against the scale the block will decode with (its fp16 value).
void round_iq4_indices(const float* x, int n, float scale, uint8_t* index) {
  const float inverse = scale != 0 ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) index[i] = static_cast<uint8_t>(nearest_iq4_index(inverse * x[i]));
}

// 32 indices as 16 bytes: element j < 16 in qs[j]'s low nibble, j + 16 in its high.
void pack_iq4_nibbles(const uint8_t* index, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(index[j] | index[j + 16] << 4);
}

}  // namespace

int iq4_nl_index(const BlockIQ4_NL& b, int i) { return i < 16 ? b.qs[i] & 15 : b.qs[i - 16] >> 4; }

// As ggml: d * float(kvalues_iq4nl[index]).
void dequantize_block_iq4_nl(const BlockIQ4_NL& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int i = 0; i < kQK4_NL; ++i) y[i] = d * static_cast<float>(kIQ4NLValues[iq4_nl_index(b, i)]);
}

void quantize_block_iq4_nl(const float* x, BlockIQ4_NL& b) {
  uint8_t index[kQK4_NL];
  const float scale = fit_iq4_scale(x, kQK4_NL, index);
  b.d = f32_to_fp16(scale);
  round_iq4_indices(x, kQK4_NL, fp16_to_f32(b.d), index);
  pack_iq4_nibbles(index, b.qs);
}

// IQ4_XS: each sub-block's best scale as for IQ4_NL; d = -(the largest of
// them in magnitude) / 32 so that it takes the 6-bit ls - 32 = -32 (ggml's
// choice); then every sub-block's ls rounded and its indices re-rounded
// against d (ls - 32) as stored.
void quantize_block_iq4_xs(const float* x, BlockIQ4_XS& b) {
  float scale[8];
  uint8_t index[kQK_K];
  float max_scale = 0;
  for (int j = 0; j < 8; ++j) {
    scale[j] = fit_iq4_scale(x + 32 * j, 32, index + 32 * j);
    if (std::fabs(scale[j]) > std::fabs(max_scale)) max_scale = scale[j];
  }
  b.d = f32_to_fp16(-max_scale / 32.0f);
  const float d = fp16_to_f32(b.d), inverse_d = d != 0 ? 1.0f / d : 0.0f;
  b.scales_h = 0;
  std::memset(b.scales_l, 0, sizeof(b.scales_l));
  for (int j = 0; j < 8; ++j) {
    const int ls = std::clamp(static_cast<int>(std::nearbyint(inverse_d * scale[j])), -32, 31) + 32;
    b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | (ls & 15) << (4 * (j % 2)));
    b.scales_h = static_cast<uint16_t>(b.scales_h | (ls >> 4) << (2 * j));
    round_iq4_indices(x + 32 * j, 32, d * static_cast<float>(ls - 32), index + 32 * j);
    pack_iq4_nibbles(index + 32 * j, b.qs + 16 * j);
  }
}

int iq4_xs_index(const BlockIQ4_XS& b, int i) {
  const uint8_t byte = b.qs[16 * (i / 32) + i % 16];
  return i % 32 < 16 ? byte & 15 : byte >> 4;
}

// As ggml: dl = d * float(ls - 32), then dl * float(kvalues_iq4nl[index]).
void dequantize_block_iq4_xs(const BlockIQ4_XS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * static_cast<float>(iq4_xs_scale(b, j));
    for (int i = 32 * j; i < 32 * j + 32; ++i) y[i] = dl * static_cast<float>(kIQ4NLValues[iq4_xs_index(b, i)]);
  }
}

}  // namespace kvserve
