// Q5_0, Q5_1, IQ4_NL and K-quant (Q4_K, Q5_K, Q6_K) blocks: hand-built blocks decoded to
// hand-computed values, quantize round trips, and every matmul path (both
// activation precisions) against the scalar reference on random blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"
#include "kernels/quantize_kquants.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "quant_matrix.h"
#include "test_util.h"

namespace kvserve {
namespace {

using test_util::TempFile;
using test_util::TestMatrix;
using test_util::make_matrix;
using Guards = test_util::IsaAndPrecisionGuard;

// ---- Hand-built blocks -----------------------------------------------------

TEST(KQuantBlocks, SizesMatchGgml) {
  EXPECT_EQ(dtype_info(DType::Q5_0).block_bytes, 22);
  EXPECT_EQ(dtype_info(DType::Q5_1).block_bytes, 24);
  EXPECT_TRUE(dtype_info(DType::Q5_1).supported);
  EXPECT_EQ(parse_dtype("q5_1"), DType::Q5_1);
  EXPECT_EQ(dtype_info(DType::IQ4_NL).block_bytes, 18);
  EXPECT_EQ(dtype_info(DType::IQ4_NL).block_size, 32);
  EXPECT_EQ(static_cast<uint32_t>(DType::IQ4_NL), 20u);  // GGML_TYPE_IQ4_NL
  EXPECT_TRUE(dtype_info(DType::IQ4_NL).supported);
  EXPECT_EQ(parse_dtype("IQ4_NL"), DType::IQ4_NL);
  EXPECT_EQ(dtype_info(DType::IQ4_XS).block_bytes, 136);
  EXPECT_EQ(dtype_info(DType::IQ4_XS).block_size, 256);
  EXPECT_EQ(static_cast<uint32_t>(DType::IQ4_XS), 23u);  // GGML_TYPE_IQ4_XS
  EXPECT_TRUE(dtype_info(DType::IQ4_XS).supported);
  EXPECT_EQ(dtype_info(DType::Q2_K).block_bytes, 84);
  EXPECT_EQ(dtype_info(DType::Q3_K).block_bytes, 110);
  EXPECT_TRUE(dtype_info(DType::Q2_K).supported);
  EXPECT_TRUE(dtype_info(DType::Q3_K).supported);
  EXPECT_EQ(parse_dtype("q3_k"), DType::Q3_K);
  EXPECT_EQ(dtype_info(DType::Q4_K).block_bytes, 144);
  EXPECT_EQ(dtype_info(DType::Q5_K).block_bytes, 176);
  EXPECT_EQ(dtype_info(DType::Q6_K).block_bytes, 210);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 4864), 19u * 210u);
  EXPECT_EQ(parse_dtype("Q4_K"), DType::Q4_K);
}

// d = 0.5; q[i] = i (i < 16) low nibbles, 31 - i high nibbles... spelled out:
// element j < 16 has q = j with fifth bit set for odd j; element 16 + j has
// q = 15 - j, fifth bit set for j < 4.
TEST(KQuantBlocks, Q5_0DecodesHandComputedValues) {
  BlockQ5_0 b{};
  b.d = 0x3800;  // 0.5
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
    if (j % 2) qh |= 1u << j;
    if (j < 4) qh |= 1u << (16 + j);
  }
  std::memcpy(b.qh, &qh, 4);
  float y[32];
  dequantize_row(DType::Q5_0, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j + (j % 2 ? 16 : 0) - 16)) << j;
    EXPECT_EQ(y[16 + j], 0.5f * static_cast<float>(15 - j + (j < 4 ? 16 : 0) - 16)) << 16 + j;
  }
  EXPECT_EQ(y[1], 0.5f);     // q 17
  EXPECT_EQ(y[16], 7.5f);    // q 31
  EXPECT_EQ(y[31], -8.0f);   // q 0
}

// Q5_1: the same bits as the Q5_0 block above, d = 0.25, m = -1, w = d q + m.
TEST(KQuantBlocks, Q5_1DecodesHandComputedValues) {
  BlockQ5_1 b{};
  b.d = 0x3400;  // 0.25
  b.m = 0xbc00;  // -1.0
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
    if (j % 2) qh |= 1u << j;
    if (j < 4) qh |= 1u << (16 + j);
  }
  std::memcpy(b.qh, &qh, 4);
  float y[32];
  dequantize_row(DType::Q5_1, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q5_1_value(b, j), j + (j % 2 ? 16 : 0)) << j;
    EXPECT_EQ(y[j], 0.25f * static_cast<float>(j + (j % 2 ? 16 : 0)) - 1.0f) << j;
    EXPECT_EQ(y[16 + j], 0.25f * static_cast<float>(15 - j + (j < 4 ? 16 : 0)) - 1.0f) << 16 + j;
  }
  EXPECT_EQ(y[16], 6.75f);   // q 31
  EXPECT_EQ(y[31], -1.0f);   // q 0
}

// IQ4_NL: d = 0.5, element j < 16 has index j, element 16 + j index 15 - j;
// w = d * ggml's kvalues_iq4nl[index], written out here.
TEST(KQuantBlocks, IQ4_NLDecodesHandComputedValues) {
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  BlockIQ4_NL b{};
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  float y[32];
  dequantize_row(DType::IQ4_NL, &b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(iq4_nl_index(b, j), j);
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(levels[j])) << j;
    EXPECT_EQ(y[16 + j], 0.5f * static_cast<float>(levels[15 - j])) << 16 + j;
  }
  EXPECT_EQ(y[0], -63.5f);
  EXPECT_EQ(y[16], 56.5f);
  EXPECT_EQ(y[8], 0.5f);
}

// IQ4_XS: d = 0.25, sub-block scales ls = {0, 63, 32, 33, 17, 40, 5, 50}
// written by hand as low nibbles (scales_l) and top two bits (scales_h);
// sub-block j's element i < 16 has index (i + j) % 16, element 16 + i index 15 - i.
TEST(KQuantBlocks, IQ4_XSDecodesHandComputedValues) {
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const int ls[8] = {0, 63, 32, 33, 17, 40, 5, 50};
  BlockIQ4_XS b{};
  b.d = 0x3400;  // 0.25
  const uint8_t low[4] = {0xf0, 0x10, 0x81, 0x25};
  std::memcpy(b.scales_l, low, 4);
  b.scales_h = 0xc9ac;  // top bits 0, 3, 2, 2, 1, 2, 0, 3
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 16; ++i) b.qs[16 * j + i] = static_cast<uint8_t>((i + j) % 16 | (15 - i) << 4);
  std::vector<float> y(256);
  dequantize_row(DType::IQ4_XS, &b, y.data(), 256);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(iq4_xs_scale(b, j), ls[j] - 32) << j;
    const float dl = 0.25f * static_cast<float>(ls[j] - 32);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(y[32 * j + i], dl * static_cast<float>(levels[(i + j) % 16])) << 32 * j + i;
      EXPECT_EQ(y[32 * j + 16 + i], dl * static_cast<float>(levels[15 - i])) << 32 * j + 16 + i;
    }
  }
  EXPECT_EQ(y[0], -8.0f * -127.0f);  // ls 0: scale -32
  EXPECT_EQ(y[64], 0.0f);            // ls 32: scale 0
  EXPECT_EQ(y[32 + 16], 7.75f * 113.0f);  // ls 63, index 15
}

// Q2_K: d = 0.5, dmin = 0.25, group g's scale byte g | (15 - g) << 4; every
// qs byte 0b11100100, so value i's q is its 32-value column k = i % 128 / 32.
TEST(KQuantBlocks, Q2_KDecodesHandComputedValues) {
  BlockQ2_K b{};
  b.d = 0x3800;     // 0.5
  b.dmin = 0x3400;  // 0.25
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>(g | (15 - g) << 4);
  std::memset(b.qs, 0xe4, sizeof(b.qs));
  std::vector<float> y(256);
  dequantize_row(DType::Q2_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16, q = i % 128 / 32;
    EXPECT_EQ(q2_k_value(b, i), q) << i;
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(g) * static_cast<float>(q) - 0.25f * static_cast<float>(15 - g)) << i;
  }
  EXPECT_EQ(y[0], -3.75f);               // g 0: scale 0, min 15
  EXPECT_EQ(y[255], 0.5f * 15 * 3);      // g 15: scale 15, min 0, q 3
}

// Q3_K: d = 0.5; scale bytes 0..7 = 0x21 (low four bits 1 for groups 0..7,
// 2 for 8..15), bytes 8..11 = 0b11100100 (top two bits g / 4), so
// sc - 32 = {-31, -15, 2, 18} for g / 4 = 0..3; qs bytes 0b11100100 (low
// bits k = i % 128 / 32); hmask bytes 0x0f: bit 4h + k set for the first
// 128 values only, the second 128 subtract 4.
TEST(KQuantBlocks, Q3_KDecodesHandComputedValues) {
  BlockQ3_K b{};
  b.d = 0x3800;  // 0.5
  std::memset(b.scales, 0x21, 8);
  std::memset(b.scales + 8, 0xe4, 4);
  std::memset(b.qs, 0xe4, sizeof(b.qs));
  std::memset(b.hmask, 0x0f, sizeof(b.hmask));
  const int scale[4] = {-31, -15, 2, 18};
  std::vector<float> y(256);
  dequantize_row(DType::Q3_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16, q = i % 128 / 32 - (i < 128 ? 0 : 4);
    EXPECT_EQ(q3_k_scale(b.scales, g), scale[g / 4]) << i;
    EXPECT_EQ(q3_k_value(b, i), q) << i;
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(scale[g / 4]) * static_cast<float>(q)) << i;
  }
  EXPECT_EQ(y[128], 0.5f * 2 * -4);  // g 8, q -4
}

// Scales and mins written as the 12 packed bytes by hand: sub-blocks 0..3
// take scale 1, 2, 3, 4 and min 0, 1, 2, 3 directly; 4..7 take scale
// 37 (0b100101), 16, 63, 5 and min 40 (0b101000), 0, 17, 63 split into a low
// nibble (bytes 8..11) and top bits (bits 6..7 of bytes 0..3 and 4..7).
void hand_scales(uint8_t* s) {
  const uint8_t bytes[12] = {
      static_cast<uint8_t>(1 | 2 << 6), static_cast<uint8_t>(2 | 1 << 6), static_cast<uint8_t>(3 | 3 << 6), 4,
      static_cast<uint8_t>(0 | 2 << 6), 1, static_cast<uint8_t>(2 | 1 << 6), static_cast<uint8_t>(3 | 3 << 6),
      static_cast<uint8_t>(5 | 8 << 4), static_cast<uint8_t>(0 | 0 << 4), static_cast<uint8_t>(15 | 1 << 4),
      static_cast<uint8_t>(5 | 15 << 4)};
  std::memcpy(s, bytes, 12);
}
constexpr int kHandScale[8] = {1, 2, 3, 4, 37, 16, 63, 5};
constexpr int kHandMin[8] = {0, 1, 2, 3, 40, 0, 17, 63};

TEST(KQuantBlocks, ScaleMinPackingMatchesHandBytes) {
  uint8_t s[12], packed[12];
  hand_scales(s);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    const KScaleMin sm = kquant_scale_min(s, j);
    EXPECT_EQ(sm.scale, kHandScale[j]) << j;
    EXPECT_EQ(sm.min, kHandMin[j]) << j;
    sc[j] = static_cast<uint8_t>(kHandScale[j]);
    mn[j] = static_cast<uint8_t>(kHandMin[j]);
  }
  pack_kquant_scales(sc, mn, packed);
  EXPECT_EQ(0, std::memcmp(s, packed, 12));
}

// Q4_K: d = 0.25, dmin = 0.125; chunk k's byte l holds low nibble (l + k) % 16
// (value 64k + l) and high nibble 15 - l % 16 (value 64k + 32 + l).
TEST(KQuantBlocks, Q4_KDecodesHandComputedValues) {
  BlockQ4_K b{};
  b.d = 0x3400;     // 0.25
  b.dmin = 0x3000;  // 0.125
  hand_scales(b.scales);
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 32; ++l) b.qs[32 * k + l] = static_cast<uint8_t>((l + k) % 16 | (15 - l % 16) << 4);
  std::vector<float> y(256);
  dequantize_row(DType::Q4_K, &b, y.data(), 256);
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 32; ++l) {
      const int lo = 2 * k, hi = 2 * k + 1;
      EXPECT_EQ(y[64 * k + l], 0.25f * kHandScale[lo] * ((l + k) % 16) - 0.125f * kHandMin[lo]) << 64 * k + l;
      EXPECT_EQ(y[64 * k + 32 + l], 0.25f * kHandScale[hi] * (15 - l % 16) - 0.125f * kHandMin[hi]) << 64 * k + 32 + l;
    }
  EXPECT_EQ(y[64 * 3 + 32], 0.25f * 5 * 15 - 0.125f * 63);  // sub-block 7, q 15
}

// Q5_K: Q4_K's nibbles plus fifth bits qh[l] = l (bit 2k for value 64k + l,
// bit 2k + 1 for 64k + 32 + l).
TEST(KQuantBlocks, Q5_KDecodesHandComputedValues) {
  BlockQ5_K b{};
  b.d = 0x3400;
  b.dmin = 0x3000;
  hand_scales(b.scales);
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 32; ++l) b.qs[32 * k + l] = static_cast<uint8_t>((l + k) % 16 | (15 - l % 16) << 4);
  for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(l * 7 + 3);
  std::vector<float> y(256);
  dequantize_row(DType::Q5_K, &b, y.data(), 256);
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 32; ++l) {
      const int bits = l * 7 + 3;
      const int q_lo = (l + k) % 16 + 16 * ((bits >> (2 * k)) & 1);
      const int q_hi = 15 - l % 16 + 16 * ((bits >> (2 * k + 1)) & 1);
      EXPECT_EQ(y[64 * k + l], 0.25f * kHandScale[2 * k] * q_lo - 0.125f * kHandMin[2 * k]) << 64 * k + l;
      EXPECT_EQ(y[64 * k + 32 + l], 0.25f * kHandScale[2 * k + 1] * q_hi - 0.125f * kHandMin[2 * k + 1]);
    }
}

// Q6_K: d = 0.5, scales[g] = g - 8 (negative ones too); value i of half h,
// group g, position l has low bits (l + g) % 16 and high bits (l + h + g) % 4.
TEST(KQuantBlocks, Q6_KDecodesHandComputedValues) {
  BlockQ6_K b{};
  b.d = 0x3800;
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g - 8);
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      // groups 0, 1 in the low nibbles of ql[l], ql[32 + l]; 2, 3 in the high ones
      b.ql[64 * h + l] = static_cast<uint8_t>((l + 0) % 16 | ((l + 2) % 16) << 4);
      b.ql[64 * h + 32 + l] = static_cast<uint8_t>((l + 1) % 16 | ((l + 3) % 16) << 4);
      uint8_t qh = 0;
      for (int g = 0; g < 4; ++g) qh = static_cast<uint8_t>(qh | ((l + h + g) % 4) << (2 * g));
      b.qh[32 * h + l] = qh;
    }
  std::vector<float> y(256);
  dequantize_row(DType::Q6_K, &b, y.data(), 256);
  for (int h = 0; h < 2; ++h)
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        const int i = 128 * h + 32 * g + l;
        const int q = (l + g) % 16 + 16 * ((l + h + g) % 4);
        EXPECT_EQ(y[i], 0.5f * static_cast<float>(i / 16 - 8) * static_cast<float>(q - 32)) << i;
      }
}

// ---- Quantize round trips ---------------------------------------------------

// Each value within one quantization step (the sub-block's scale) of its input,
// and the encoding idempotent (re-quantizing decoded values gives them back).
TEST(KQuantBlocks, QuantizeRoundTripsWithinOneStep) {
  std::mt19937 rng(5);
  for (DType type : {DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                     DType::Q5_K, DType::Q6_K}) {
    const int64_t n = 512;
    std::vector<float> x = test_util::random_vector(n, rng, 1.0f), y(n), z(n);
    x[3] = 4.0f;  // an outlier
    std::vector<uint8_t> bytes(dtype_row_bytes(type, n));
    quantize_row(type, x.data(), bytes.data(), n);
    dequantize_row(type, bytes.data(), y.data(), n);
    const int64_t group = type == DType::Q6_K || type == DType::Q2_K || type == DType::Q3_K ? 16 : 32;
    // IQ4: 254 units of max|x| / 127 with gaps of up to 24 between levels
    const bool iq4 = type == DType::IQ4_NL || type == DType::IQ4_XS;
    const float levels = type == DType::Q4_K   ? 15.0f
                         : type == DType::Q6_K ? 62.0f
                         : type == DType::Q2_K ? 3.0f
                         : type == DType::Q3_K ? 8.0f
                         : iq4                 ? 254.0f / 24.0f
                                               : 31.0f;
    for (int64_t g = 0; g < n / group; ++g) {
      float lo = 0, hi = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      // the sub-block's range over its levels, plus slack for the 6/8-bit scale rounding
      const float step = (std::max(hi, -lo) * 2.0f) / levels;
      for (int64_t i = g * group; i < (g + 1) * group; ++i)
        ASSERT_NEAR(y[i], x[i], 1.1f * step) << dtype_name(type) << " value " << i;
    }
    double err = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (y[i] - x[i]) * (y[i] - x[i]);
      mag += x[i] * x[i];
    }
    const bool four_bit = type == DType::Q4_K || iq4;
    const double bound = type == DType::Q2_K ? 0.45 : type == DType::Q3_K ? 0.25 : four_bit ? 0.15 : 0.08;
    EXPECT_LT(std::sqrt(err / mag), bound) << dtype_name(type);
  }
}

// ---- Matmul paths on random blocks --------------------------------------------


struct KQuantShape {
  int64_t rows, cols, n_tokens;
};

// Rows not a multiple of the 4-row decode pass, several super-blocks, every
// small-batch token count (1..9: one or two token groups per call), 13 and 16
// (the largest small batches), 17 (the prefill tiles).
std::vector<KQuantShape> shapes_for(DType type) {
  const bool small_blocks = dtype_info(type).block_size == 32;
  const std::vector<int64_t> cols = small_blocks ? std::vector<int64_t>{32, 96, 288, 2080}
                                                 : std::vector<int64_t>{256, 768, 1280};
  std::vector<KQuantShape> shapes;
  for (int64_t rows : {1, 7, 33})
    for (int64_t c : cols)
      for (int64_t n_tokens : test_util::skip_slow() ? std::vector<int64_t>{1, 2, 3, 4, 5, 8, 17}  // as kernels_test
                                                     : std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17})
        shapes.push_back({rows, c, n_tokens});
  return shapes;
}

std::string describe(DType type, Isa isa, ActivationPrecision p, const KQuantShape& s) {
  return std::string(dtype_name(type)) + " on " + isa_name(isa) + " (" + activation_precision_name(p) +
         " activations), rows " + std::to_string(s.rows) + ", cols " + std::to_string(s.cols) + ", tokens " +
         std::to_string(s.n_tokens);
}

class KQuantMatmul : public ::testing::TestWithParam<DType> {};

// Every path against matmul_reference (dequantize + f32 dot), within 1e-5
// (f32 activations) or 1e-2 (q8 activations) of sum |w| |x|.
TEST_P(KQuantMatmul, EveryPathMatchesReference) {
  const DType type = GetParam();
  Guards guards;
  uint32_t seed = 1;
  for (const ActivationPrecision precision : {ActivationPrecision::kF32, ActivationPrecision::kQ8})
    for (const KQuantShape& s : shapes_for(type)) {
      set_activation_precision(precision);
      const TestMatrix m = make_matrix(type, s.rows, s.cols, seed++);
      std::mt19937 rng(seed++);
      const std::vector<float> x = test_util::random_vector(static_cast<size_t>(s.n_tokens * s.cols), rng, 1.0f);
      std::vector<float> expected(static_cast<size_t>(s.n_tokens * s.rows));
      matmul_reference(m.view, x.data(), s.n_tokens, expected.data());
      const double tolerance = precision == ActivationPrecision::kQ8 ? 1e-2 : 1e-5;
      for (Isa isa : available_isas()) {
        set_kernel_isa(isa);
        std::vector<float> y(expected.size(), std::numeric_limits<float>::quiet_NaN());
        matmul(m.view, x.data(), s.n_tokens, y.data());
        for (int64_t t = 0; t < s.n_tokens; ++t)
          for (int64_t r = 0; r < s.rows; ++r) {
            double magnitude = 0;
            for (int64_t c = 0; c < s.cols; ++c)
              magnitude += std::fabs(m.dequantized[r * s.cols + c]) * std::fabs(x[t * s.cols + c]);
            ASSERT_GT(magnitude, 0.0) << "all-zero test input";
            const size_t i = static_cast<size_t>(t * s.rows + r);
            ASSERT_NEAR(y[i], expected[i], tolerance * magnitude)
                << describe(type, isa, precision, s) << ", token " << t << ", row " << r;
          }
      }
    }
}

// The SIMD paths against the scalar table with the same activations: the
// same integer dots (q8) or the same products (f32), summed in another order.
TEST_P(KQuantMatmul, SimdPathsAgreeWithScalarPath) {
  const DType type = GetParam();
  Guards guards;
  uint32_t seed = 500;
  for (const ActivationPrecision precision : {ActivationPrecision::kF32, ActivationPrecision::kQ8})
    for (const KQuantShape& s : shapes_for(type)) {
      set_activation_precision(precision);
      const TestMatrix m = make_matrix(type, s.rows, s.cols, seed++);
      std::mt19937 rng(seed++);
      const std::vector<float> x = test_util::random_vector(static_cast<size_t>(s.n_tokens * s.cols), rng, 1.0f);
      std::vector<float> scalar(static_cast<size_t>(s.n_tokens * s.rows));
      set_kernel_isa(Isa::Scalar);
      matmul(m.view, x.data(), s.n_tokens, scalar.data());
      for (Isa isa : available_isas()) {
        set_kernel_isa(isa);
        std::vector<float> y(scalar.size(), std::numeric_limits<float>::quiet_NaN());
        matmul(m.view, x.data(), s.n_tokens, y.data());
        for (int64_t t = 0; t < s.n_tokens; ++t)
          for (int64_t r = 0; r < s.rows; ++r) {
            double magnitude = 0;
            for (int64_t c = 0; c < s.cols; ++c)
              magnitude += std::fabs(m.dequantized[r * s.cols + c]) * std::fabs(x[t * s.cols + c]);
            const size_t i = static_cast<size_t>(t * s.rows + r);
            ASSERT_NEAR(y[i], scalar[i], 1e-5 * magnitude)
                << describe(type, isa, precision, s) << ", token " << t << ", row " << r;
          }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(KQuantTypes, KQuantMatmul,
                         ::testing::Values(DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K,
                                           DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// ---- Load-time validation ----------------------------------------------------

// A K-quant tensor whose rows are not whole 256-value super-blocks is refused
// when the file is opened, naming the tensor and the block size.
TEST(KQuantLoad, RowLengthNotMultipleOf256IsRefused) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  const std::vector<uint8_t> bytes(144 * 2, 0);
  const std::string name = "blk.0.ffn_up.weight";
  w.add_tensor(name, DType::Q4_K, {256, 2}, bytes.data(), bytes.size());
  std::vector<uint8_t> file_bytes = w.serialize();
  // The writer refuses such a shape, so patch ne = {256, 2} to {128, 4}:
  // the tensor info is the name, n_dims (u32), then ne[0], ne[1] (u64).
  const auto at = std::search(file_bytes.begin(), file_bytes.end(), name.begin(), name.end());
  ASSERT_NE(at, file_bytes.end());
  const size_t ne_at = static_cast<size_t>(at - file_bytes.begin()) + name.size() + 4;
  const uint64_t ne[2] = {128, 4};
  std::memcpy(file_bytes.data() + ne_at, ne, sizeof(ne));
  TempFile f(".gguf");
  f.write(file_bytes);
  try {
    GGUFFile file(f.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("blk.0.ffn_up.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("not a multiple of the q4_k block size 256"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace kvserve
