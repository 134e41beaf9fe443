#include "kernels/quantize_kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"

namespace kvserve {
namespace {

template <typename Block>  // BlockQ5_0 or BlockQ5_1
uint32_t load_qh(const Block& b) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, sizeof(qh));  // little-endian, as ggml stores it
  return qh;
}

// The fp16 value a float scale is stored as, read back (what decoding sees).
float stored_fp16(float v, uint16_t* bits) {
  *bits = f32_to_fp16(v);
  return fp16_to_f32(*bits);
}

int clamp_round(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi); }

// Shared by Q4_K (levels 15) and Q5_K (31): per-sub-block 6-bit scales and
// mins, then q[i] in 0..levels for each of the 256 values.
struct KScales {
  uint16_t d_bits, dmin_bits;
  uint8_t scale[8], min[8];
  int q[kQK_K];
};

// A sub-block's x ~ scale * q - min with q in 0..levels and min >= 0.
struct AffineFit {
  float scale, min;
};

// From the range: the scale that spans [min(0, lo), hi].
AffineFit range_fit(const float* x, int n, int levels) {
  const float lo = std::min(0.0f, *std::min_element(x, x + n));
  const float hi = std::max(lo, *std::max_element(x, x + n));
  return {(hi - lo) / static_cast<float>(levels), -lo};
}

// Searched: for a range of candidate step sizes around the range's, round
// every x to its level, then fit scale and offset to those levels by least
// squares (offset kept <= 0, i.e. min >= 0); the candidate with the least
// squared error wins. Never worse than range_fit, which is candidate 0.
AffineFit searched_fit(const float* x, int n, int levels) {
  AffineFit best = range_fit(x, n, levels);
  if (best.scale <= 0) return best;
  auto error_of = [&](float scale, float min) {
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float q = static_cast<float>(std::clamp(static_cast<int>(std::nearbyint((x[i] + min) / scale)), 0, levels));
      const float e = scale * q - min - x[i];
      err += e * e;
    }
    return err;
  };
  float best_err = error_of(best.scale, best.min);
  const float lo = -best.min, span = best.scale * static_cast<float>(levels);
  int q[256];
  for (int step = -12; step <= 12; ++step) {
    const float iscale = (static_cast<float>(levels) + 0.08f * static_cast<float>(step)) / span;
    float sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(static_cast<int>(std::nearbyint((x[i] - lo) * iscale)), 0, levels);
      sq += static_cast<float>(q[i]);
      sqq += static_cast<float>(q[i] * q[i]);
      sx += x[i];
      sqx += static_cast<float>(q[i]) * x[i];
    }
    const float det = static_cast<float>(n) * sqq - sq * sq;
    if (det <= 0) continue;
    float scale = (static_cast<float>(n) * sqx - sq * sx) / det;
    float offset = (sqq * sx - sq * sqx) / det;
    if (offset > 0) {  // min must stay >= 0: fit the scale alone
      offset = 0;
      scale = sqx / sqq;
    }
    if (scale <= 0) continue;
    const float err = error_of(scale, -offset);
    if (err < best_err) {
      best_err = err;
      best = {scale, -offset};
    }
  }
  return best;
}

KScales choose_kquant_scales(const float* x, int levels, bool search = false) {
  KScales s{};
  float sub_scale[8], sub_min[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const AffineFit fit = search ? searched_fit(x + 32 * j, 32, levels) : range_fit(x + 32 * j, 32, levels);
    sub_scale[j] = fit.scale;
    sub_min[j] = fit.min;
    max_scale = std::max(max_scale, sub_scale[j]);
    max_min = std::max(max_min, sub_min[j]);
  }
  const float d = stored_fp16(max_scale / 63.0f, &s.d_bits);
  const float dmin = stored_fp16(max_min / 63.0f, &s.dmin_bits);
  for (int j = 0; j < 8; ++j) {
    s.scale[j] = static_cast<uint8_t>(d > 0 ? clamp_round(sub_scale[j] / d, 0, 63) : 0);
    s.min[j] = static_cast<uint8_t>(dmin > 0 ? clamp_round(sub_min[j] / dmin, 0, 63) : 0);
    const float ds = d * s.scale[j], dm = dmin * s.min[j];
    for (int l = 0; l < 32; ++l) s.q[32 * j + l] = ds > 0 ? clamp_round((x[32 * j + l] + dm) / ds, 0, levels) : 0;
  }
  return s;
}

// The low nibble of Q4_K / Q5_K value i into qs.
void put_k_nibble(uint8_t* qs, int i, int q) {
  const int k = i / 64, l = i % 64;
  uint8_t& byte = qs[32 * k + l % 32];
  byte = static_cast<uint8_t>(l < 32 ? (byte & 0xf0) | (q & 15) : (byte & 0x0f) | ((q & 15) << 4));
}

}  // namespace

void pack_kquant_scales(const uint8_t scale[8], const uint8_t min[8], uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>((scale[j] & 63) | ((scale[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>((min[j] & 63) | ((min[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((scale[j + 4] & 15) | ((min[j + 4] & 15) << 4));
  }
}

int q5_0_value(const BlockQ5_0& b, int i) {
  const int j = i % 16;
  const int low = i < 16 ? b.qs[j] & 15 : b.qs[j] >> 4;
  return low | static_cast<int>((load_qh(b) >> i) & 1) << 4;
}

int q5_1_value(const BlockQ5_1& b, int i) {
  const int j = i % 16;
  const int low = i < 16 ? b.qs[j] & 15 : b.qs[j] >> 4;
  return low | static_cast<int>((load_qh(b) >> i) & 1) << 4;
}

int q4_k_value(const BlockQ4_K& b, int i) {
  const int k = i / 64, l = i % 64;
  const uint8_t byte = b.qs[32 * k + l % 32];
  return l < 32 ? byte & 15 : byte >> 4;
}

int q5_k_value(const BlockQ5_K& b, int i) {
  const int k = i / 64, l = i % 64;
  const uint8_t byte = b.qs[32 * k + l % 32];
  const int low = l < 32 ? byte & 15 : byte >> 4;
  const int bit = (b.qh[l % 32] >> (2 * k + l / 32)) & 1;
  return low | bit << 4;
}

int q6_k_value(const BlockQ6_K& b, int i) {
  const int h = i / 128, g = i % 128 / 32, l = i % 32;
  const uint8_t byte = b.ql[64 * h + 32 * (g & 1) + l];
  const int low = g < 2 ? byte & 15 : byte >> 4;
  return low | ((b.qh[32 * h + l] >> (2 * g)) & 3) << 4;
}

void dequantize_block_q5_0(const BlockQ5_0& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int i = 0; i < kQK4_0; ++i) y[i] = static_cast<float>(q5_0_value(b, i) - 16) * d;
}

// As ggml's dequantize_row_q5_1 (and kvserve's Q4_1): float(q) * d + m.
void dequantize_block_q5_1(const BlockQ5_1& b, float* y) {
  const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
  for (int i = 0; i < kQK4_1; ++i) y[i] = static_cast<float>(q5_1_value(b, i)) * d + m;
}

void dequantize_block_q4_k(const BlockQ4_K& b, float* y) {
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    const KScaleMin sm = kquant_scale_min(b.scales, j);
    const float ds = d * sm.scale, dm = dmin * sm.min;
    for (int l = 0; l < 32; ++l) y[32 * j + l] = ds * static_cast<float>(q4_k_value(b, 32 * j + l)) - dm;
  }
}

void dequantize_block_q5_k(const BlockQ5_K& b, float* y) {
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    const KScaleMin sm = kquant_scale_min(b.scales, j);
    const float ds = d * sm.scale, dm = dmin * sm.min;
    for (int l = 0; l < 32; ++l) y[32 * j + l] = ds * static_cast<float>(q5_k_value(b, 32 * j + l)) - dm;
  }
}

void dequantize_block_q6_k(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int i = 0; i < kQK_K; ++i)
    y[i] = d * static_cast<float>(b.scales[i / 16]) * static_cast<float>(q6_k_value(b, i) - 32);
}

// ggml's quantize_row_q5_0_ref rule: d = (value of largest magnitude) / -16.
void quantize_block_q5_0(const float* x, BlockQ5_0& b) {
  float amax = 0, max = 0;
  for (int j = 0; j < kQK4_0; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -16.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  uint32_t qh = 0;
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
    const int q1 = std::min(31, static_cast<int>(x[j + 16] * id + 16.5f));
    b.qs[j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j | static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(b.qh, &qh, sizeof(qh));
}

void quantize_block_q5_1(const float* x, BlockQ5_1& b) {
  float min = x[0], max = x[0];
  for (int j = 1; j < kQK4_1; ++j) {
    min = std::fmin(min, x[j]);
    max = std::fmax(max, x[j]);
  }
  const float d = (max - min) / 31.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  b.d = f32_to_fp16(d);
  b.m = f32_to_fp16(min);
  uint32_t qh = 0;
  for (int j = 0; j < kQK4_1 / 2; ++j) {
    const int q0 = std::min(31, static_cast<int>((x[j] - min) * id + 0.5f));
    const int q1 = std::min(31, static_cast<int>((x[j + 16] - min) * id + 0.5f));
    b.qs[j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
    qh |= static_cast<uint32_t>(q0 >> 4) << j | static_cast<uint32_t>(q1 >> 4) << (j + 16);
  }
  std::memcpy(b.qh, &qh, sizeof(qh));
}

namespace {

void write_q4_k(const KScales& s, BlockQ4_K& b) {
  b.d = s.d_bits;
  b.dmin = s.dmin_bits;
  pack_kquant_scales(s.scale, s.min, b.scales);
  for (int i = 0; i < kQK_K; ++i) put_k_nibble(b.qs, i, s.q[i]);
}

void write_q5_k(const KScales& s, BlockQ5_K& b) {
  b.d = s.d_bits;
  b.dmin = s.dmin_bits;
  pack_kquant_scales(s.scale, s.min, b.scales);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int i = 0; i < kQK_K; ++i) {
    put_k_nibble(b.qs, i, s.q[i]);
    const int k = i / 64, l = i % 64;
    b.qh[l % 32] = static_cast<uint8_t>(b.qh[l % 32] | (s.q[i] >> 4) << (2 * k + l / 32));
  }
}

// A symmetric group's scale for q in -32..31: amax / 31, or (searched) the
// least-squares scale of the best of several roundings around it.
float q6_group_scale(const float* x, bool search) {
  float amax = 0;
  for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[l]));
  float best = amax / 31.0f;
  if (!search || best <= 0) return best;
  auto error_of = [&](float scale) {
    float err = 0;
    for (int l = 0; l < 16; ++l) {
      const float e = scale * static_cast<float>(std::clamp(static_cast<int>(std::nearbyint(x[l] / scale)), -32, 31)) - x[l];
      err += e * e;
    }
    return err;
  };
  float best_err = error_of(best);
  for (int step = -10; step <= 10; ++step) {
    const float iscale = (31.0f + 0.1f * static_cast<float>(step)) / amax;
    float sqq = 0, sqx = 0;
    for (int l = 0; l < 16; ++l) {
      const float q = static_cast<float>(std::clamp(static_cast<int>(std::nearbyint(x[l] * iscale)), -32, 31));
      sqq += q * q;
      sqx += q * x[l];
    }
    if (sqq <= 0 || sqx <= 0) continue;
    const float scale = sqx / sqq;
    const float err = error_of(scale);
    if (err < best_err) {
      best_err = err;
      best = scale;
    }
  }
  return best;
}

}  // namespace

void quantize_block_q4_k(const float* x, BlockQ4_K& b) { write_q4_k(choose_kquant_scales(x, 15), b); }
void quantize_block_q5_k(const float* x, BlockQ5_K& b) { write_q5_k(choose_kquant_scales(x, 31), b); }
void quantize_block_q4_k_searched(const float* x, BlockQ4_K& b) { write_q4_k(choose_kquant_scales(x, 15, true), b); }
void quantize_block_q5_k_searched(const float* x, BlockQ5_K& b) { write_q5_k(choose_kquant_scales(x, 31, true), b); }

namespace {

// Per 16 values a signed 8-bit scale (in units of d), q in -32..31.
void write_q6_k(const float* x, BlockQ6_K& b, bool search) {
  float sub_scale[16], max_scale = 0;
  for (int g = 0; g < 16; ++g) {
    sub_scale[g] = q6_group_scale(x + 16 * g, search);
    max_scale = std::max(max_scale, sub_scale[g]);
  }
  const float d = stored_fp16(max_scale / 127.0f, &b.d);
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int g = 0; g < 16; ++g) {
    b.scales[g] = static_cast<int8_t>(d > 0 ? clamp_round(sub_scale[g] / d, 0, 127) : 0);
    const float ds = d * b.scales[g];
    for (int l = 0; l < 16; ++l) {
      const int i = 16 * g + l;
      const int q = (ds > 0 ? clamp_round(x[i] / ds, -32, 31) : 0) + 32;
      const int h = i / 128, grp = i % 128 / 32, li = i % 32;
      uint8_t& byte = b.ql[64 * h + 32 * (grp & 1) + li];
      byte = static_cast<uint8_t>(grp < 2 ? byte | (q & 15) : byte | (q & 15) << 4);
      b.qh[32 * h + li] = static_cast<uint8_t>(b.qh[32 * h + li] | (q >> 4) << (2 * grp));
    }
  }
}

}  // namespace

void quantize_block_q6_k(const float* x, BlockQ6_K& b) { write_q6_k(x, b, false); }
void quantize_block_q6_k_searched(const float* x, BlockQ6_K& b) { write_q6_k(x, b, true); }

}  // namespace kvserve
