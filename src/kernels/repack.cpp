#include "kernels/repack.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/dispatch.h"
#include "kernels/quantize_kquants.h"

namespace kvserve {
namespace {

constexpr int kRows = 8;

// The types of 256-value super-blocks.
bool is_256(DType type) {
  return type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K || type == DType::IQ4_XS ||
         type == DType::Q2_K || type == DType::Q3_K;
}

int64_t sb_values(DType type) { return is_256(type) ? kQK_K : 32; }

size_t header_bytes(DType type) {
  switch (type) {
    case DType::Q4_1: case DType::Q5_1: return 32;
    case DType::Q4_K: case DType::Q5_K: return 16 + 16 + 64 + 64;
    case DType::Q6_K: case DType::Q3_K: return 16 + 128;
    case DType::IQ4_XS: return 16 + 64;
    case DType::Q2_K: return 16 + 16 + 128;
    default: return 16;
  }
}

size_t sub_block_bytes(DType type) {
  switch (type) {
    case DType::Q8_0: return 256;
    case DType::Q5_0: case DType::Q5_1: case DType::Q5_K: return 128 + 32;
    case DType::Q6_K: return 128 + 64;
    case DType::Q3_K: return 64 + 32;
    case DType::Q2_K: return 64;
    default: return 128;
  }
}

size_t sb_bytes(DType type) { return header_bytes(type) + static_cast<size_t>(sb_values(type) / 32) * sub_block_bytes(type); }

// The stored integers of one original block (sb_values of them): unsigned
// for every type but Q8_0.
void block_values(DType type, const uint8_t* block, int* q) {
  switch (type) {
    case DType::Q4_0: case DType::Q4_1: case DType::IQ4_NL: {  // IQ4_NL: the level indices
      const uint8_t* qs = block + (type == DType::Q4_1 ? offsetof(BlockQ4_1, qs) : offsetof(BlockQ4_0, qs));
      for (int i = 0; i < 16; ++i) {
        q[i] = qs[i] & 15;
        q[i + 16] = qs[i] >> 4;
      }
      return;
    }
    case DType::Q8_0: {
      const auto& b = *reinterpret_cast<const BlockQ8_0*>(block);
      for (int i = 0; i < 32; ++i) q[i] = b.qs[i];
      return;
    }
    case DType::Q5_0: case DType::Q5_1: {
      const uint8_t* qs = block + (type == DType::Q5_0 ? offsetof(BlockQ5_0, qs) : offsetof(BlockQ5_1, qs));
      uint32_t qh;
      std::memcpy(&qh, block + (type == DType::Q5_0 ? offsetof(BlockQ5_0, qh) : offsetof(BlockQ5_1, qh)), sizeof(qh));
      for (int i = 0; i < 16; ++i) {
        q[i] = (qs[i] & 15) | static_cast<int>((qh >> i) & 1) << 4;
        q[i + 16] = (qs[i] >> 4) | static_cast<int>((qh >> (i + 16)) & 1) << 4;
      }
      return;
    }
    case DType::Q4_K: case DType::Q5_K: {
      const uint8_t* qs = type == DType::Q4_K ? reinterpret_cast<const BlockQ4_K*>(block)->qs
                                              : reinterpret_cast<const BlockQ5_K*>(block)->qs;
      const uint8_t* qh = type == DType::Q5_K ? reinterpret_cast<const BlockQ5_K*>(block)->qh : nullptr;
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = qs[32 * k + l];
          q[64 * k + l] = byte & 15;
          q[64 * k + 32 + l] = byte >> 4;
          if (qh != nullptr) {
            q[64 * k + l] |= (qh[l] >> (2 * k) & 1) << 4;
            q[64 * k + 32 + l] |= (qh[l] >> (2 * k + 1) & 1) << 4;
          }
        }
      return;
    }
    case DType::Q2_K: {
      const auto& b = *reinterpret_cast<const BlockQ2_K*>(block);
      for (int i = 0; i < kQK_K; ++i) q[i] = q2_k_value(b, i);
      return;
    }
    case DType::Q3_K: {  // unsigned: q + 4 in 0..7
      const auto& b = *reinterpret_cast<const BlockQ3_K*>(block);
      for (int i = 0; i < kQK_K; ++i) q[i] = q3_k_value(b, i) + 4;
      return;
    }
    case DType::IQ4_XS: {  // the level indices
      const auto& b = *reinterpret_cast<const BlockIQ4_XS*>(block);
      for (int i = 0; i < kQK_K; ++i) q[i] = iq4_xs_index(b, i);
      return;
    }
    case DType::Q6_K: {
      const auto& b = *reinterpret_cast<const BlockQ6_K*>(block);
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t* ql = b.ql + 64 * h;
          const uint8_t qh = b.qh[32 * h + l];
          q[128 * h + l] = (ql[l] & 15) | (qh & 3) << 4;
          q[128 * h + 32 + l] = (ql[32 + l] & 15) | (qh >> 2 & 3) << 4;
          q[128 * h + 64 + l] = (ql[l] >> 4) | (qh >> 4 & 3) << 4;
          q[128 * h + 96 + l] = (ql[32 + l] >> 4) | (qh >> 6 & 3) << 4;
        }
      return;
    }
    default: throw Error(std::string("repack: weight type ") + dtype_name(type) + " is not packable");
  }
}

uint16_t block_d_bits(DType type, const uint8_t* block) {
  switch (type) {
    case DType::Q4_K: return reinterpret_cast<const BlockQ4_K*>(block)->d;
    case DType::Q5_K: return reinterpret_cast<const BlockQ5_K*>(block)->d;
    case DType::Q6_K: return reinterpret_cast<const BlockQ6_K*>(block)->d;
    case DType::Q2_K: return reinterpret_cast<const BlockQ2_K*>(block)->d;
    case DType::Q3_K: return reinterpret_cast<const BlockQ3_K*>(block)->d;
    default: {  // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL all start with the fp16 d
      uint16_t d;
      std::memcpy(&d, block, sizeof(d));
      return d;
    }
  }
}

// Q2_K / Q3_K: 2-bit planes, register p = 0..1 holding chunk 4p + s in bits
// 2s, 2s + 1; Q3_K's third bits after them, bit c of byte 4r + k for chunk c.
void pack_two_bit_sub_block(DType type, const int* const (&q)[kRows], uint8_t* out) {
  for (int p = 0; p < 2; ++p)
    for (int r = 0; r < kRows; ++r)
      for (int k = 0; k < 4; ++k) {
        int bits = 0;
        for (int s = 0; s < 4; ++s) bits |= (q[r][4 * (4 * p + s) + k] & 3) << (2 * s);
        out[32 * p + 4 * r + k] = static_cast<uint8_t>(bits);
      }
  if (type != DType::Q3_K) return;
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < 4; ++k) {
      int bits = 0;
      for (int c = 0; c < 8; ++c) bits |= (q[r][4 * c + k] >> 2 & 1) << c;
      out[64 + 4 * r + k] = static_cast<uint8_t>(bits);
    }
}

// One sub-block (32 values) of 8 rows: q[r][v] for v < 32, into the chunk layout.
void pack_sub_block(DType type, const int* const (&q)[kRows], uint8_t* out) {
  if (type == DType::Q2_K || type == DType::Q3_K) return pack_two_bit_sub_block(type, q, out);
  if (type == DType::Q8_0) {
    for (int c = 0; c < 8; ++c)
      for (int r = 0; r < kRows; ++r)
        for (int k = 0; k < 4; ++k) out[32 * c + 4 * r + k] = static_cast<uint8_t>(q[r][4 * c + k] + 128);
    return;
  }
  for (int p = 0; p < 4; ++p)
    for (int r = 0; r < kRows; ++r)
      for (int k = 0; k < 4; ++k)
        out[32 * p + 4 * r + k] = static_cast<uint8_t>((q[r][8 * p + k] & 15) | (q[r][8 * p + 4 + k] & 15) << 4);
  uint8_t* high = out + 128;
  if (type == DType::Q5_0 || type == DType::Q5_1 || type == DType::Q5_K) {
    for (int r = 0; r < kRows; ++r)
      for (int k = 0; k < 4; ++k) {
        int bits = 0;
        for (int c = 0; c < 8; ++c) bits |= (q[r][4 * c + k] >> 4 & 1) << c;
        high[4 * r + k] = static_cast<uint8_t>(bits);
      }
  } else if (type == DType::Q6_K) {
    for (int half = 0; half < 2; ++half)
      for (int r = 0; r < kRows; ++r)
        for (int k = 0; k < 4; ++k) {
          int bits = 0;
          for (int c = 0; c < 4; ++c) bits |= (q[r][4 * (4 * half + c) + k] >> 4 & 3) << (2 * c);
          high[32 * half + 4 * r + k] = static_cast<uint8_t>(bits);
        }
  }
}

void pack_group_scales(DType type, const uint8_t* const (&blocks)[kRows], uint8_t* out);

// The header of one super-block of 8 rows; blocks[r] is row r's original
// block (nullptr for a padding row).
void pack_header(DType type, const uint8_t* const (&blocks)[kRows], uint8_t* out) {
  uint16_t d[kRows] = {}, second[kRows] = {};
  for (int r = 0; r < kRows; ++r) {
    if (blocks[r] == nullptr) continue;
    d[r] = block_d_bits(type, blocks[r]);
    if (type == DType::Q4_1) second[r] = reinterpret_cast<const BlockQ4_1*>(blocks[r])->m;
    if (type == DType::Q5_1) second[r] = reinterpret_cast<const BlockQ5_1*>(blocks[r])->m;
    if (type == DType::Q4_K) second[r] = reinterpret_cast<const BlockQ4_K*>(blocks[r])->dmin ^ 0x8000;
    if (type == DType::Q5_K) second[r] = reinterpret_cast<const BlockQ5_K*>(blocks[r])->dmin ^ 0x8000;
    if (type == DType::Q2_K) second[r] = reinterpret_cast<const BlockQ2_K*>(blocks[r])->dmin ^ 0x8000;
  }
  std::memcpy(out, d, sizeof(d));
  if (type == DType::Q4_1 || type == DType::Q5_1 || type == DType::Q4_K || type == DType::Q5_K || type == DType::Q2_K)
    std::memcpy(out + 16, second, sizeof(second));
  pack_group_scales(type, blocks, out);
}

// The per-row sub-block (group) scales of the K-quant and IQ4_XS headers.
void pack_group_scales(DType type, const uint8_t* const (&blocks)[kRows], uint8_t* out) {
  if (type == DType::Q4_K || type == DType::Q5_K) {
    uint8_t* scale = out + 32;
    uint8_t* min = out + 96;
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < 8; ++j) {
        KScaleMin sm{0, 0};
        if (blocks[r] != nullptr) {
          // Q4_K and Q5_K share the d, dmin, scales prefix.
          sm = kquant_scale_min(reinterpret_cast<const BlockQ4_K*>(blocks[r])->scales, j);
        }
        scale[8 * j + r] = sm.scale;
        min[8 * j + r] = sm.min;
      }
  } else if (type == DType::Q6_K) {
    auto* scale = reinterpret_cast<int8_t*>(out + 16);
    for (int r = 0; r < kRows; ++r)
      for (int g = 0; g < 16; ++g)
        scale[8 * g + r] = blocks[r] != nullptr ? reinterpret_cast<const BlockQ6_K*>(blocks[r])->scales[g] : 0;
  } else if (type == DType::Q3_K) {
    auto* scale = reinterpret_cast<int8_t*>(out + 16);
    for (int r = 0; r < kRows; ++r)
      for (int g = 0; g < 16; ++g)
        scale[8 * g + r] = static_cast<int8_t>(
            blocks[r] != nullptr ? q3_k_scale(reinterpret_cast<const BlockQ3_K*>(blocks[r])->scales, g) : 0);
  } else if (type == DType::Q2_K) {  // scale | min << 4, as the original bytes
    for (int r = 0; r < kRows; ++r)
      for (int g = 0; g < 16; ++g)
        out[32 + 8 * g + r] = blocks[r] != nullptr ? reinterpret_cast<const BlockQ2_K*>(blocks[r])->scales[g] : 0;
  } else if (type == DType::IQ4_XS) {
    auto* scale = reinterpret_cast<int8_t*>(out + 16);
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < 8; ++j)
        scale[8 * j + r] = static_cast<int8_t>(
            blocks[r] != nullptr ? iq4_xs_scale(*reinterpret_cast<const BlockIQ4_XS*>(blocks[r]), j) : 0);
  }
}

}  // namespace

bool packable_type(DType type) {
  switch (type) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0: case DType::IQ4_NL:
    case DType::IQ4_XS: case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default: return false;
  }
}

size_t packed_group_bytes(DType type, int64_t cols) {
  return static_cast<size_t>(cols / sb_values(type)) * sb_bytes(type);
}

size_t packed_matrix_bytes(DType type, int64_t rows, int64_t cols) {
  return static_cast<size_t>((rows + kRows - 1) / kRows) * packed_group_bytes(type, cols);
}

void repack_rows8(const TensorView& w, uint8_t* dst) {
  if (!packable_type(w.type)) throw Error(std::string("repack: weight type ") + dtype_name(w.type) + " is not packable");
  const int64_t values = sb_values(w.type), cols = w.cols(), rows = w.rows();
  if (cols % values != 0)
    throw Error("repack: " + w.name + " has " + std::to_string(cols) + " columns, not a multiple of " +
                std::to_string(values));
  const int64_t n_sb = cols / values;
  const size_t block_bytes = static_cast<size_t>(dtype_info(w.type).block_bytes);
  const size_t header = header_bytes(w.type), sub_bytes = sub_block_bytes(w.type);
  for (int64_t g = 0; g < (rows + kRows - 1) / kRows; ++g) {
    for (int64_t b = 0; b < n_sb; ++b) {
      const uint8_t* blocks[kRows];
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = g * kRows + r;
        blocks[r] = row < rows ? w.row(row) + static_cast<size_t>(b) * block_bytes : nullptr;
      }
      uint8_t* out = dst + static_cast<size_t>(g) * packed_group_bytes(w.type, cols) + static_cast<size_t>(b) * sb_bytes(w.type);
      pack_header(w.type, blocks, out);
      int q[kRows][kQK_K] = {};
      for (int r = 0; r < kRows; ++r)
        if (blocks[r] != nullptr) block_values(w.type, blocks[r], q[r]);
      for (int64_t j = 0; j < values / 32; ++j) {
        const int* rows_j[kRows];
        for (int r = 0; r < kRows; ++r) rows_j[r] = q[r] + 32 * j;
        pack_sub_block(w.type, rows_j, out + header + static_cast<size_t>(j) * sub_bytes);
      }
    }
  }
}

// ---- Activations -------------------------------------------------------------

bool packed_act_is_256(DType type) { return is_256(type); }

size_t packed_act_qs_bytes(int64_t cols) { return (static_cast<size_t>(cols) + 63) / 64 * 64; }

size_t packed_act_row_bytes(DType type, int64_t cols) {
  const size_t blocks = packed_act_is_256(type) ? static_cast<size_t>(cols / 256) * sizeof(PackedAct256)
                                                : static_cast<size_t>(cols / 32) * sizeof(PackedAct32);
  return packed_act_qs_bytes(cols) + (blocks + 63) / 64 * 64;
}

PackedActRow packed_act_row(const uint8_t* row, int64_t cols) {
  return {reinterpret_cast<const int8_t*>(row), row + packed_act_qs_bytes(cols)};
}

namespace {
float max_abs(const float* x, int n) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

// 32 values with the per-half refinements of PackedAct32: q = round((x 2^k_h) / d)
// (x 2^k_h is exact and at most max|x|, so q stays in [-127, 127]).
PackedAct32 quantize_block32(const float* x, int8_t* q) {
  const float half_max[2] = {max_abs(x, 16), max_abs(x + 16, 16)};
  PackedAct32 a{};
  const float inv_d = packed_act_scale(half_max, 2, &a.d, a.shift);
  for (int h = 0; h < 2; ++h) {
    const int32_t shift = a.shift[h];
    const float refine = static_cast<float>(1 << (3 - shift));
    int32_t sum = 0;
    for (int i = 16 * h; i < 16 * h + 16; ++i) sum += q[i] = static_cast<int8_t>(std::nearbyint(x[i] * refine * inv_d));
    a.sum += at_block_scale(sum, shift);
  }
  a.s = a.d * static_cast<float>(a.sum);
  return a;
}

// 256 values with the sub-block refinements of PackedAct256: q = round((x 2^k_j)
// / d) (x 2^k_j is exact and at most max|x|, so q stays in [-127, 127]).
PackedAct256 quantize_super_block(const float* x, int8_t* q) {
  float sub_max[8];
  for (int j = 0; j < 8; ++j) sub_max[j] = max_abs(x + 32 * j, 32);
  PackedAct256 a{};
  const float inv_d = packed_act_scale(sub_max, 8, &a.d, a.shift);
  for (int j = 0; j < 8; ++j) {
    const int32_t shift = a.shift[j];
    const float refine = static_cast<float>(1 << (3 - shift));
    for (int i = 32 * j; i < 32 * j + 32; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * refine * inv_d));
    for (int h = 0; h < 2; ++h) {
      int32_t sum = 0;
      for (int i = 32 * j + 16 * h; i < 32 * j + 16 * h + 16; ++i) sum += q[i];
      a.sum16[2 * j + h] = static_cast<int16_t>(at_block_scale(sum, shift));
    }
    a.sum32[j] = static_cast<int16_t>(a.sum16[2 * j] + a.sum16[2 * j + 1]);
  }
  return a;
}
}  // namespace

void quantize_packed_activations(DType type, const float* x, int64_t cols, uint8_t* dst) {
#if KVSERVE_HAVE_SIMD
  if (active_isa() != Isa::Scalar) return quantize_packed_activations_avx2(type, x, cols, dst);
#endif
  quantize_packed_activations_scalar(type, x, cols, dst);
}

void quantize_packed_activations_scalar(DType type, const float* x, int64_t cols, uint8_t* dst) {
  auto* qs = reinterpret_cast<int8_t*>(dst);
  uint8_t* blocks = dst + packed_act_qs_bytes(cols);
  if (packed_act_is_256(type)) {
    auto* out = reinterpret_cast<PackedAct256*>(blocks);
    for (int64_t b = 0; b < cols / 256; ++b) out[b] = quantize_super_block(x + b * 256, qs + b * 256);
    return;
  }
  auto* out = reinterpret_cast<PackedAct32*>(blocks);
  for (int64_t b = 0; b < cols / 32; ++b) out[b] = quantize_block32(x + b * 32, qs + b * 32);
}

// ---- The reference -------------------------------------------------------------

namespace {

// IQ4_XS: sum over sub-blocks j of (ls_j - 32) (dot(level, qx) << shift_j), exact.
int32_t iq4_xs_dots(const BlockIQ4_XS& b, const int* index, const int8_t* qx, const PackedAct256& act) {
  int32_t dots = 0;
  for (int j = 0; j < 8; ++j) {
    int32_t dot = 0;
    for (int i = 32 * j; i < 32 * j + 32; ++i) dot += kIQ4NLValues[index[i]] * qx[i];
    dots += iq4_xs_scale(b, j) * at_block_scale(dot, act.shift[j]);
  }
  return dots;
}

// Q2_K / Q3_K: the integer part of one super-block's dot, for
// acc = fma(dots, d dx, acc) (+ fma(mins, -dmin dx, acc) for Q2_K); q as
// block_values gives them (Q3_K: q + 4).
struct GroupDots {
  int32_t dots = 0, mins = 0;
};
GroupDots two_bit_dots(DType type, const uint8_t* block, const int* q, const int8_t* qx, const PackedAct256& act) {
  GroupDots out;
  for (int g = 0; g < 16; ++g) {
    int32_t dot = 0;
    for (int i = 16 * g; i < 16 * g + 16; ++i) dot += q[i] * qx[i];
    dot = at_block_scale(dot, act.shift[g / 2]);
    if (type == DType::Q2_K) {
      const uint8_t packed = reinterpret_cast<const BlockQ2_K*>(block)->scales[g];
      out.dots += (packed & 15) * dot;
      out.mins += (packed >> 4) * act.sum16[g];
    } else {
      const int scale = q3_k_scale(reinterpret_cast<const BlockQ3_K*>(block)->scales, g);
      out.dots += scale * (dot - 4 * act.sum16[g]);
    }
  }
  return out;
}

// One (row, token) over every super-block, from the original blocks.
float q8_row_dot(DType type, const uint8_t* row, int64_t cols, const PackedActRow& x) {
  const size_t block_bytes = static_cast<size_t>(dtype_info(type).block_bytes);
  float acc = 0;
  if (!packed_act_is_256(type)) {
    const auto* act = static_cast<const PackedAct32*>(x.blocks);
    for (int64_t b = 0; b < cols / 32; ++b) {
      const uint8_t* block = row + static_cast<size_t>(b) * block_bytes;
      int q[32];
      block_values(type, block, q);
      if (type == DType::IQ4_NL)
        for (int& v : q) v = kIQ4NLValues[v];
      int32_t isum = 0;
      for (int h = 0; h < 2; ++h) {
        int32_t dot = 0;
        for (int i = 16 * h; i < 16 * h + 16; ++i) dot += q[i] * x.qs[32 * b + i];
        isum += at_block_scale(dot, act[b].shift[h]);
      }
      if (type == DType::Q4_0) isum -= 8 * act[b].sum;
      if (type == DType::Q5_0) isum -= 16 * act[b].sum;
      const float d = fp16_to_f32(block_d_bits(type, block));
      acc = std::fma(static_cast<float>(isum), d * act[b].d, acc);
      if (type == DType::Q4_1) acc = std::fma(fp16_to_f32(reinterpret_cast<const BlockQ4_1*>(block)->m), act[b].s, acc);
      if (type == DType::Q5_1) acc = std::fma(fp16_to_f32(reinterpret_cast<const BlockQ5_1*>(block)->m), act[b].s, acc);
    }
    return acc;
  }
  const auto* act = static_cast<const PackedAct256*>(x.blocks);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + static_cast<size_t>(b) * block_bytes;
    const int8_t* qx = x.qs + 256 * b;
    const float d = fp16_to_f32(block_d_bits(type, block));
    int q[kQK_K];
    block_values(type, block, q);
    if (type == DType::Q2_K || type == DType::Q3_K) {
      const GroupDots g = two_bit_dots(type, block, q, qx, act[b]);
      acc = std::fma(static_cast<float>(g.dots), d * act[b].d, acc);
      if (type == DType::Q2_K)
        acc = std::fma(static_cast<float>(g.mins), -fp16_to_f32(reinterpret_cast<const BlockQ2_K*>(block)->dmin) * act[b].d, acc);
      continue;
    }
    if (type == DType::IQ4_XS) {
      acc = std::fma(static_cast<float>(iq4_xs_dots(*reinterpret_cast<const BlockIQ4_XS*>(block), q, qx, act[b])),
                     d * act[b].d, acc);
      continue;
    }
    if (type == DType::Q6_K) {
      const auto& q6 = *reinterpret_cast<const BlockQ6_K*>(block);
      // |dots| <= 256 x 63 x 127 x 128 x 8 = 2097414144 < 2^31 (q unsigned 0..63,
      // |scale| <= 128, shift <= 3); dots - 32 bias (q - 32 in -32..31) is half that.
      int32_t dots = 0, bias = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t dot = 0;
        for (int i = 16 * g; i < 16 * g + 16; ++i) dot += q[i] * qx[i];
        dots += q6.scales[g] * at_block_scale(dot, act[b].shift[g / 2]);
        bias += q6.scales[g] * act[b].sum16[g];
      }
      acc = std::fma(static_cast<float>(dots - 32 * bias), d * act[b].d, acc);
      continue;
    }
    const auto& k = *reinterpret_cast<const BlockQ4_K*>(block);  // Q5_K shares the prefix
    int32_t dots = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      const KScaleMin sm = kquant_scale_min(k.scales, j);
      int32_t dot = 0;
      for (int i = 32 * j; i < 32 * j + 32; ++i) dot += q[i] * qx[i];
      dots += sm.scale * at_block_scale(dot, act[b].shift[j]);
      mins += sm.min * act[b].sum32[j];
    }
    acc = std::fma(static_cast<float>(dots), d * act[b].d, acc);
    acc = std::fma(static_cast<float>(mins), -fp16_to_f32(k.dmin) * act[b].d, acc);
  }
  return acc;
}

}  // namespace

void matmul_q8_reference(const TensorView& w, const float* x, int64_t n_tokens, float* y) {
  if (!packable_type(w.type)) throw Error(std::string("matmul_q8_reference: weight type ") + dtype_name(w.type) + " is not packable");
  const int64_t cols = w.cols(), rows = w.rows();
  if (cols % sb_values(w.type) != 0) throw Error("matmul_q8_reference: " + w.name + " has a partial block per row");
  const size_t row_bytes = packed_act_row_bytes(w.type, cols);
  std::vector<uint8_t> act(row_bytes * static_cast<size_t>(n_tokens) + 64);
  uint8_t* base = act.data() + (64 - reinterpret_cast<uintptr_t>(act.data()) % 64) % 64;
  for (int64_t t = 0; t < n_tokens; ++t) quantize_packed_activations(w.type, x + t * cols, cols, base + t * row_bytes);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const PackedActRow xr = packed_act_row(base + t * row_bytes, cols);
    for (int64_t r = 0; r < rows; ++r) y[t * rows + r] = q8_row_dot(w.type, w.row(r), cols, xr);
  }
}

}  // namespace kvserve
