// Q2_K / Q3_K (de)quantization, bit-exact with ggml's decoding
// (dequantize_row_q2_K / _q3_K). The quantizers are simple (per 16 values a
// range or max|x| rule, nearest rounding), for tests and `kvserve synth`; not
// llama.cpp's searched scales.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "kernels/quantize_kquants.h"

namespace kvserve {
namespace {

int clamp_round(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi); }

// The byte and shift of value i's two low bits in qs (Q2_K and Q3_K alike).
struct TwoBitPlace {
  int byte, shift;
};
TwoBitPlace two_bit_place(int i) { return {32 * (i / 128) + i % 32, 2 * (i % 128 / 32)}; }

int two_bits(const uint8_t* qs, int i) {
  const TwoBitPlace at = two_bit_place(i);
  return (qs[at.byte] >> at.shift) & 3;
}

void put_two_bits(uint8_t* qs, int i, int q) {
  const TwoBitPlace at = two_bit_place(i);
  qs[at.byte] = static_cast<uint8_t>(qs[at.byte] | (q & 3) << at.shift);
}

// The bit of hmask that holds value i's high bit: byte i % 32, bit 4 (i / 128) + i % 128 / 32.
int q3_k_high_bit(const BlockQ3_K& b, int i) { return (b.hmask[i % 32] >> (4 * (i / 128) + i % 128 / 32)) & 1; }

void put_q3_k_scale(uint8_t* scales, int g, int sc) {  // sc in 0..63, as q3_k_scale() reads it
  scales[g % 8] = static_cast<uint8_t>(scales[g % 8] | (sc & 15) << (4 * (g / 8)));
  scales[8 + g % 4] = static_cast<uint8_t>(scales[8 + g % 4] | (sc >> 4) << (2 * (g / 4)));
}

}  // namespace

int q2_k_value(const BlockQ2_K& b, int i) { return two_bits(b.qs, i); }
int q3_k_value(const BlockQ3_K& b, int i) { return two_bits(b.qs, i) - (q3_k_high_bit(b, i) ? 0 : 4); }

// As ggml: dl = d * float(sc & 15), ml = dmin * float(sc >> 4), y = dl * float(q) - ml.
void dequantize_block_q2_k(const BlockQ2_K& b, float* y) {
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(b.scales[g] & 15), ml = dmin * static_cast<float>(b.scales[g] >> 4);
    for (int i = 16 * g; i < 16 * g + 16; ++i) y[i] = dl * static_cast<float>(q2_k_value(b, i)) - ml;
  }
}

// As ggml: dl = d * float(sc - 32), y = dl * float(q).
void dequantize_block_q3_k(const BlockQ3_K& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(q3_k_scale(b.scales, g));
    for (int i = 16 * g; i < 16 * g + 16; ++i) y[i] = dl * static_cast<float>(q3_k_value(b, i));
  }
}

// Per 16 values: min = -min(0, x), scale = range / 3; both stored in units of
// d = max scale / 15 and dmin = max min / 15 (4 bits each).
void quantize_block_q2_k(const float* x, BlockQ2_K& b) {
  float scale[16], min[16], max_scale = 0, max_min = 0;
  for (int g = 0; g < 16; ++g) {
    const float lo = std::min(0.0f, *std::min_element(x + 16 * g, x + 16 * g + 16));
    const float hi = std::max(lo, *std::max_element(x + 16 * g, x + 16 * g + 16));
    scale[g] = (hi - lo) / 3.0f;
    min[g] = -lo;
    max_scale = std::max(max_scale, scale[g]);
    max_min = std::max(max_min, min[g]);
  }
  b.d = f32_to_fp16(max_scale / 15.0f);
  b.dmin = f32_to_fp16(max_min / 15.0f);
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  std::memset(b.qs, 0, sizeof(b.qs));
  for (int g = 0; g < 16; ++g) {
    const int sc = d > 0 ? clamp_round(scale[g] / d, 0, 15) : 0, m = dmin > 0 ? clamp_round(min[g] / dmin, 0, 15) : 0;
    b.scales[g] = static_cast<uint8_t>(sc | m << 4);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
    for (int i = 16 * g; i < 16 * g + 16; ++i) put_two_bits(b.qs, i, dl > 0 ? clamp_round((x[i] + ml) / dl, 0, 3) : 0);
  }
}

// Per 16 values a signed scale that maps the largest |x| to -4 (ggml's
// choice of sign), stored as 6 bits in units of d = -(largest)/32.
void quantize_block_q3_k(const float* x, BlockQ3_K& b) {
  float scale[16], max_scale = 0;
  for (int g = 0; g < 16; ++g) {
    float max = 0;
    for (int i = 16 * g; i < 16 * g + 16; ++i)
      if (std::fabs(x[i]) > std::fabs(max)) max = x[i];
    scale[g] = max / -4.0f;
    if (std::fabs(scale[g]) > std::fabs(max_scale)) max_scale = scale[g];
  }
  b.d = f32_to_fp16(max_scale / -32.0f);
  const float d = fp16_to_f32(b.d);
  std::memset(b.hmask, 0, sizeof(b.hmask));
  std::memset(b.qs, 0, sizeof(b.qs));
  std::memset(b.scales, 0, sizeof(b.scales));
  for (int g = 0; g < 16; ++g) {
    const int sc = d != 0 ? clamp_round(scale[g] / d, -32, 31) : 0;
    put_q3_k_scale(b.scales, g, sc + 32);
    const float dl = d * static_cast<float>(sc);
    for (int i = 16 * g; i < 16 * g + 16; ++i) {
      const int q = (dl != 0 ? clamp_round(x[i] / dl, -4, 3) : 0) + 4;  // 0..7
      put_two_bits(b.qs, i, q);
      b.hmask[i % 32] = static_cast<uint8_t>(b.hmask[i % 32] | (q >> 2) << (4 * (i / 128) + i % 128 / 32));
    }
  }
}

}  // namespace kvserve
