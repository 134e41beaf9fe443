// The packed 8-bit-activation kernels (weights repacked with rows interleaved
// by 8, kernels/repack.h): every SIMD path equals matmul_q8_reference bit for
// bit on random blocks of awkward shapes and token counts (so a row's result
// never depends on the other tokens of the call), on one or two threads; and
// the reference is within the activation rounding of matmul_reference.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/repack.h"
#include "quant_matrix.h"
#include "test_util.h"

namespace kvserve {
namespace {

using test_util::make_matrix;
using test_util::TestMatrix;

const DType kPackedTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K,
                              DType::Q4_K, DType::Q5_K, DType::Q6_K};

struct PackedMatrix {
  TestMatrix m;
  AlignedBuffer<uint8_t> packed;
  TensorView view;  // m.view with .packed set
};

PackedMatrix make_packed(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  PackedMatrix p{make_matrix(type, rows, cols, seed), {}, {}};
  p.packed.resize(packed_matrix_bytes(type, rows, cols));
  repack_rows8(p.m.view, p.packed.data());
  p.view = p.m.view;
  p.view.packed = p.packed.data();
  return p;
}


std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : available_isas())
    if (isa != Isa::Scalar) out.push_back(isa);
  return out;
}

// Index of the first float that differs bitwise, or -1.
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

std::vector<int64_t> cols_for(DType type) {
  return dtype_info(type).block_size == 256 ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 96, 2080};
}

class PackedMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(PackedMatmul, SimdPathsMatchTheQ8ReferenceBitwise) {
  const DType type = GetParam();
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  set_activation_precision(ActivationPrecision::kQ8);
  uint32_t seed = 1;
  for (int64_t rows : {1, 7, 8, 9, 33})
    for (int64_t cols : cols_for(type))
      for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 13, 17, 40}) {
        const PackedMatrix p = make_packed(type, rows, cols, seed++);
        std::mt19937 rng(seed);
        const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
        std::vector<float> want(static_cast<size_t>(n * rows));
        matmul_q8_reference(p.m.view, x.data(), n, want.data());
        for (Isa isa : simd_isas()) {
          set_kernel_isa(isa);
          std::vector<float> got(want.size(), -1.0f);
          matmul(p.view, x.data(), n, got.data());
          const int64_t at = first_difference(got, want);
          ASSERT_EQ(at, -1) << dtype_name(type) << " on " << isa_name(isa) << ", rows " << rows << ", cols " << cols
                            << ", tokens " << n << ": token " << at / rows << " row " << at % rows << " got "
                            << got[static_cast<size_t>(at)] << " want " << want[static_cast<size_t>(at)];
        }
      }
}

// Many tokens (several prefill tiles) on one and on two threads.
TEST_P(PackedMatmul, PrefillTilesAndThreadsChangeNoBit) {
  const DType type = GetParam();
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  set_activation_precision(ActivationPrecision::kQ8);
  const int64_t rows = 75, cols = dtype_info(type).block_size == 256 ? 4096 : 2080,
                n = 150;
  const PackedMatrix p = make_packed(type, rows, cols, 99);
  std::mt19937 rng(7);
  const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
  std::vector<float> want(static_cast<size_t>(n * rows));
  matmul_q8_reference(p.m.view, x.data(), n, want.data());
  const int threads = omp_get_max_threads();
  for (Isa isa : simd_isas()) {
    set_kernel_isa(isa);
    for (int t : {1, 2}) {
      omp_set_num_threads(t);
      std::vector<float> got(want.size());
      matmul(p.view, x.data(), n, got.data());
      EXPECT_EQ(first_difference(got, want), -1) << dtype_name(type) << " on " << isa_name(isa) << ", " << t << " threads";
    }
  }
  omp_set_num_threads(threads);
}

// The reference's only error is the rounding of activations to 8 bits.
TEST_P(PackedMatmul, Q8ReferenceIsWithinActivationRoundingOfF32) {
  const DType type = GetParam();
  uint32_t seed = 500;
  for (int64_t rows : {3, 9})
    for (int64_t cols : cols_for(type)) {
      const int64_t n = 3;
      const TestMatrix m = make_matrix(type, rows, cols, seed++);
      std::mt19937 rng(seed);
      const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
      std::vector<float> got(static_cast<size_t>(n * rows)), want(got.size());
      matmul_q8_reference(m.view, x.data(), n, got.data());
      matmul_reference(m.view, x.data(), n, want.data());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double magnitude = 0;
          for (int64_t c = 0; c < cols; ++c)
            magnitude += std::fabs(m.dequantized[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(t * cols + c)]);
          const size_t i = static_cast<size_t>(t * rows + r);
          EXPECT_LE(std::fabs(got[i] - want[i]), 1e-2 * magnitude + 1e-6) << dtype_name(type) << " row " << r;
        }
    }
}

// The SIMD activation quantizer writes the scalar loop's bytes: random
// values of several magnitudes, an all-zero block (d = 0), exact halves
// (round to even) and the extremes of a block.
TEST(PackedActivations, SimdMatchesScalarBytes) {
#if KVSERVE_HAVE_SIMD
  if (!isa_available(Isa::Avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(41);
  for (DType type : {DType::Q4_0, DType::Q4_K})
    for (int64_t cols : packed_act_is_256(type) ? std::vector<int64_t>{256, 768, 4096} : std::vector<int64_t>{32, 96, 2080}) {
      for (float scale : {1e-3f, 1.0f, 300.0f}) {
        std::uniform_real_distribution<float> dist(-scale, scale);
        std::vector<float> x(static_cast<size_t>(cols));
        for (float& v : x) v = dist(rng);
        for (int64_t j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = 0.0f;                       // a zero block
        if (cols >= 64) {  // max 127, so d = 1: the others are exact ties, -14.5 .. 15.5, rounded to even
          x[32] = 127.0f;
          for (int64_t j = 33; j < 64; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j - 48) + 0.5f;
        }
        const size_t bytes = packed_act_row_bytes(type, cols);
        std::vector<uint8_t> want(bytes, 0xa5), got(bytes, 0xa5);
        quantize_packed_activations_scalar(type, x.data(), cols, want.data());
        quantize_packed_activations_avx2(type, x.data(), cols, got.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), bytes)) << dtype_name(type) << " cols " << cols << " scale " << scale;
      }
    }
#else
  GTEST_SKIP() << "built without SIMD kernels";
#endif
}

// Activations that exercise the refinements of PackedAct256 (block 256,
// sub-blocks of 32) or PackedAct32 (block 32, halves of 16): one outlier per
// block, the other sub-blocks at fractions of it (some exactly at a boundary
// m / 2^k, where the finer step still fits), some all zero.
std::vector<float> outlier_activations(int64_t n, int64_t cols, std::mt19937& rng, size_t block = 256) {
  const float fractions[] = {1.0f, 0.6f, 0.5f, 0.3f, 0.25f, 0.2f, 0.125f, 0.1f, 0.01f, 0.0f};
  const size_t sub = block == 256 ? 32 : 16;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> fraction(0, 9), position(0, 255), size(1, 8);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (size_t b = 0; b < x.size(); b += block) {
    const float outlier = 8.0f * static_cast<float>(size(rng));
    for (size_t j = 0; j < block / sub; ++j) {
      const float magnitude = outlier * fractions[fraction(rng)];
      for (size_t i = 0; i < sub; ++i) x[b + sub * j + i] = magnitude * unit(rng);
      x[b + sub * j + static_cast<size_t>(position(rng)) % sub] = -magnitude;  // the sub-block's max, exactly
    }
    x[b + static_cast<size_t>(position(rng)) % block] = unit(rng) < 0 ? -outlier : outlier;
  }
  return x;
}

// Every SIMD path equals matmul_q8_reference bit for bit on outlier_activations
// of `block`, over awkward row, column and token counts.
void expect_refined_kernels_match_the_q8_reference(DType type, std::initializer_list<int64_t> col_counts, size_t block,
                                                   uint32_t seed) {
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  set_activation_precision(ActivationPrecision::kQ8);
  for (int64_t rows : {1, 9, 33})
    for (int64_t cols : col_counts)
      for (int64_t n : {1, 3, 4, 5, 8, 9, 17}) {
        const PackedMatrix p = make_packed(type, rows, cols, seed++);
        std::mt19937 rng(seed);
        const std::vector<float> x = outlier_activations(n, cols, rng, block);
        std::vector<float> want(static_cast<size_t>(n * rows));
        matmul_q8_reference(p.m.view, x.data(), n, want.data());
        for (Isa isa : simd_isas()) {
          set_kernel_isa(isa);
          std::vector<float> got(want.size(), -1.0f);
          matmul(p.view, x.data(), n, got.data());
          const int64_t at = first_difference(got, want);
          ASSERT_EQ(at, -1) << dtype_name(type) << " on " << isa_name(isa) << ", rows " << rows << ", cols " << cols
                            << ", tokens " << n << ": token " << at / rows << " row " << at % rows;
        }
      }
}

// matmul_q8_reference within half a rounding step per value of the exact
// product: step(t, c) is the activation step of token t's value c (relative to
// its block's max, 1 here), times |w|, summed over the row.
template <class StepOf>
void expect_q8_reference_within_rounding_of_f32(DType type, const TestMatrix& m, const std::vector<float>& x, int64_t n,
                                                StepOf step) {
  const int64_t rows = m.view.rows(), cols = m.view.cols();
  std::vector<float> got(static_cast<size_t>(n * rows)), want(got.size());
  matmul_q8_reference(m.view, x.data(), n, got.data());
  matmul_reference(m.view, x.data(), n, want.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double bound = 1e-6;
      for (int64_t c = 0; c < cols; ++c)
        bound += 0.5 * step(t, c) * std::fabs(m.dequantized[static_cast<size_t>(r * cols + c)]);
      const size_t i = static_cast<size_t>(t * rows + r);
      EXPECT_LE(std::fabs(got[i] - want[i]), bound) << dtype_name(type) << " token " << t << " row " << r;
    }
}

// n activations uniform in (-1e-2, 1e-2): the background the refinement tests set outliers of 1 into.
std::vector<float> small_activations(int64_t n, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (float& v : x) v = 1e-2f * unit(rng);
  return x;
}

class PackedMatmul256 : public ::testing::TestWithParam<DType> {};

TEST_P(PackedMatmul256, SubBlockRefinementsMatchTheQ8ReferenceBitwise) {
  expect_refined_kernels_match_the_q8_reference(GetParam(), {256, 1280}, 256, 700);
}

// The refinements make a sub-block far below its super-block's outlier
// nearly as exact as the outlier's: within 1/8 of the unrefined rounding.
TEST_P(PackedMatmul256, RefinedReferenceIsWithinFinerRoundingOfF32) {
  const DType type = GetParam();
  const int64_t rows = 9, cols = 512, n = 3;
  const TestMatrix m = make_matrix(type, rows, cols, 900);
  std::vector<float> x = small_activations(n * cols, 901);
  for (size_t b = 0; b < x.size(); b += 256) x[b + 77] = 1.0f;  // max|x| = 1, the other sub-blocks <= m / 8
  // Half a step per value: 1 / 127 / 2 for the outlier's sub-block, 1/8 of it elsewhere.
  expect_q8_reference_within_rounding_of_f32(type, m, x, n, [](int64_t, int64_t c) {
    return (c % 256) / 32 == 77 / 32 ? 1.0 / 127 : 1.0 / 127 / 8;
  });
}

INSTANTIATE_TEST_SUITE_P(PackedTypes, PackedMatmul256,
                         ::testing::Values(DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

class PackedMatmul32 : public ::testing::TestWithParam<DType> {};

TEST_P(PackedMatmul32, HalfRefinementsMatchTheQ8ReferenceBitwise) {
  expect_refined_kernels_match_the_q8_reference(GetParam(), {32, 96, 2080}, 32, 1700);
}

// A half far below its block's outlier rounds nearly as finely as it would
// alone: within 1/8 of the unrefined rounding.
TEST_P(PackedMatmul32, RefinedReferenceIsWithinFinerRoundingOfF32) {
  const DType type = GetParam();
  const int64_t rows = 9, cols = 96, n = 3;
  const TestMatrix m = make_matrix(type, rows, cols, 1900);
  std::vector<float> x = small_activations(n * cols, 1901);
  for (size_t b = 0; b < x.size(); b += 32) x[b + (b / 32 % 2 == 0 ? 5 : 27)] = 1.0f;  // the outlier in either half
  // Half a step per value: 1 / 127 / 2 in the outlier's half, 1/8 of it in the other.
  expect_q8_reference_within_rounding_of_f32(type, m, x, n, [&](int64_t t, int64_t c) {
    const int64_t block = (t * cols + c) / 32, outlier_half = block % 2 == 0 ? 0 : 1;
    return (c % 32) / 16 == outlier_half ? 1.0 / 127 : 1.0 / 127 / 8;
  });
}

INSTANTIATE_TEST_SUITE_P(PackedTypes, PackedMatmul32,
                         ::testing::Values(DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

// Q6_K's integer sum is the largest of all: q = 63 everywhere, scales -128 and
// every activation at full scale with the largest shift (x = +-1: q 127 << 3)
// give 256 x 63 x 127 x 128 x 8 = 2097414144 before the bias comes off, just
// under 2^31. Every path must still be exact.
TEST(PackedMatmul, Q6KWorstCaseSumsStayExact) {
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  set_activation_precision(ActivationPrecision::kQ8);
  const int64_t rows = 9, cols = 512;
  PackedMatrix p = make_packed(DType::Q6_K, rows, cols, 5);
  for (size_t b = 0; b < p.m.bytes.size(); b += sizeof(BlockQ6_K)) {
    auto& block = *reinterpret_cast<BlockQ6_K*>(p.m.bytes.data() + b);
    std::memset(block.ql, 0xff, sizeof(block.ql));
    std::memset(block.qh, 0xff, sizeof(block.qh));
    std::memset(block.scales, 0x80, sizeof(block.scales));
    block.d = f32_to_fp16(1e-4f);
  }
  repack_rows8(p.m.view, p.packed.data());
  for (float sign : {1.0f, -1.0f}) {
    const std::vector<float> x(static_cast<size_t>(2 * cols), sign);
    std::vector<float> want(static_cast<size_t>(2 * rows)), exact(want.size());
    matmul_q8_reference(p.m.view, x.data(), 2, want.data());
    matmul_reference(p.m.view, x.data(), 2, exact.data());
    EXPECT_NEAR(want[0], exact[0], 1e-5 * std::fabs(exact[0]));
    for (Isa isa : simd_isas()) {
      set_kernel_isa(isa);
      for (int64_t n : {1, 2}) {
        std::vector<float> got(static_cast<size_t>(n * rows));
        matmul(p.view, x.data(), n, got.data());
        EXPECT_EQ(got, std::vector<float>(want.begin(), want.begin() + n * rows)) << isa_name(isa) << ", sign " << sign;
      }
    }
  }
}

// The AVX2 quantizer writes the scalar loop's bytes on outlier-heavy inputs too.
TEST(PackedActivations, SimdMatchesScalarBytesWithSubBlockRefinements) {
#if KVSERVE_HAVE_SIMD
  if (!isa_available(Isa::Avx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(43);
  for (int64_t cols : {256, 1280, 4096}) {
    const std::vector<float> x = outlier_activations(1, cols, rng);
    const size_t bytes = packed_act_row_bytes(DType::Q4_K, cols);
    std::vector<uint8_t> want(bytes, 0xa5), got(bytes, 0xa5);
    quantize_packed_activations_scalar(DType::Q4_K, x.data(), cols, want.data());
    quantize_packed_activations_avx2(DType::Q4_K, x.data(), cols, got.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), bytes)) << "cols " << cols;
  }
  for (int64_t cols : {32, 96, 2080}) {
    const std::vector<float> x = outlier_activations(1, cols, rng, 32);
    const size_t bytes = packed_act_row_bytes(DType::Q4_1, cols);
    std::vector<uint8_t> want(bytes, 0xa5), got(bytes, 0xa5);
    quantize_packed_activations_scalar(DType::Q4_1, x.data(), cols, want.data());
    quantize_packed_activations_avx2(DType::Q4_1, x.data(), cols, got.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), bytes)) << "32-value blocks, cols " << cols;
  }
#else
  GTEST_SKIP() << "built without SIMD kernels";
#endif
}

// One super-block by hand: max|x| = 127 (so the unrefined step is 1), and
// sub-blocks whose max is exactly 127 / 8 (3 more bits), just above it (2
// more), 63.5 (1 more), zero, and 127 itself.
TEST(PackedActivations, SubBlockShiftsRefineTheSmallSubBlocks) {
  std::vector<float> x(256, 0.0f);
  const float sub_max[8] = {127.0f, 127.0f / 8, 15.9f, 0.0f, 63.5f, 127.0f, 31.75f, 1e-3f};
  const int32_t want_shift[8] = {3, 0, 1, 0, 2, 3, 1, 0};
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 32; ++i) x[static_cast<size_t>(32 * j + i)] = sub_max[j] * static_cast<float>(i % 5 - 2) / 2;
  std::vector<uint8_t> row(packed_act_row_bytes(DType::Q6_K, 256));
  quantize_packed_activations(DType::Q6_K, x.data(), 256, row.data());
  const PackedActRow packed = packed_act_row(row.data(), 256);
  const auto& a = *static_cast<const PackedAct256*>(packed.blocks);
  EXPECT_EQ(a.d, 1.0f / 8);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(a.shift[j], want_shift[j]) << "sub-block " << j;
    int32_t sum = 0;
    for (int i = 32 * j; i < 32 * j + 32; ++i) {
      const float step = a.d * static_cast<float>(1 << a.shift[j]);
      EXPECT_LE(std::fabs(static_cast<float>(packed.qs[i]) * step - x[static_cast<size_t>(i)]), step / 2) << i;
      sum += packed.qs[i];
    }
    EXPECT_EQ(a.sum32[j], sum * (1 << a.shift[j])) << "sub-block " << j;
  }
}

// Blocks of 32 by hand: max|x| = 127 (the unrefined step is 1) in one half,
// the other half's max exactly 127 / 8 (3 more bits), 15.9 (2 more), 63.5 (1
// more), zero or 127 itself.
TEST(PackedActivations, HalfShiftsRefineTheSmallHalf) {
  const float other_max[5] = {127.0f / 8, 15.9f, 63.5f, 0.0f, 127.0f};
  const int32_t want_other_shift[5] = {0, 1, 2, 0, 3};
  std::vector<float> x(32 * 10, 0.0f);
  for (int b = 0; b < 10; ++b) {  // block b: the outlier half first for even b, second for odd b
    const int big = b % 2;
    for (int i = 0; i < 16; ++i) {
      x[static_cast<size_t>(32 * b + 16 * big + i)] = 127.0f * static_cast<float>(i % 5 - 2) / 2;
      x[static_cast<size_t>(32 * b + 16 * (1 - big) + i)] = other_max[b / 2] * static_cast<float>(i % 5 - 2) / 2;
    }
  }
  std::vector<uint8_t> row(packed_act_row_bytes(DType::Q4_0, 320));
  quantize_packed_activations(DType::Q4_0, x.data(), 320, row.data());
  const PackedActRow packed = packed_act_row(row.data(), 320);
  for (int b = 0; b < 10; ++b) {
    const auto& a = static_cast<const PackedAct32*>(packed.blocks)[b];
    const int big = b % 2;
    EXPECT_EQ(a.d, 1.0f / 8) << "block " << b;
    EXPECT_EQ(a.shift[big], 3) << "block " << b;
    EXPECT_EQ(a.shift[1 - big], want_other_shift[b / 2]) << "block " << b;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float step = a.d * static_cast<float>(1 << a.shift[i / 16]);
      EXPECT_LE(std::fabs(static_cast<float>(packed.qs[32 * b + i]) * step - x[static_cast<size_t>(32 * b + i)]), step / 2) << i;
      sum += packed.qs[32 * b + i] * (1 << a.shift[i / 16]);
    }
    EXPECT_EQ(a.sum, sum) << "block " << b;
    EXPECT_EQ(a.s, a.d * static_cast<float>(sum)) << "block " << b;
  }
}

TEST(PackedMatmul, UnpackableTypesAreRefused) {
  TestMatrix m = make_matrix(DType::Q4_0, 8, 64, 3);
  m.view.type = DType::F16;
  std::vector<uint8_t> out(4096);
  EXPECT_FALSE(packable_type(DType::F16));
  EXPECT_THROW(repack_rows8(m.view, out.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(PackedTypes, PackedMatmul, ::testing::ValuesIn(kPackedTypes),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

// matmul_tasks (a mixture of experts' experts in one parallel region): every
// product, over its own rows of activations, equals its own matmul() bit for
// bit, on repacked weights of several types (K-quant and 32-blocks, as real
// MoE files mix them), with token counts of 1 to 9, some products sharing an
// input (gate and up of one expert) and some not.
TEST(MatmulTasks, EachProductEqualsItsMatmulAlone) {
  test_util::IsaAndPrecisionGuard guard;
  set_activation_precision(ActivationPrecision::kQ8);
  const int64_t cols = 256;
  std::vector<PackedMatrix> experts;
  const DType types[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::Q5_K};
  for (size_t e = 0; e < std::size(types); ++e)
    experts.push_back(make_packed(types[e], 8 * static_cast<int64_t>(e) + 13, cols, 200 + static_cast<uint32_t>(e)));
  for (Isa isa : simd_isas()) {
    set_kernel_isa(isa);
    std::mt19937 rng(9);
    std::vector<std::vector<float>> inputs, together, alone;
    std::vector<MatmulTask> tasks;
    for (size_t e = 0; e < experts.size(); ++e) {
      const int64_t n = 1 + static_cast<int64_t>(e * 2) % 9;
      inputs.push_back(test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f));
    }
    together.resize(experts.size() * 2);
    alone.resize(experts.size() * 2);
    for (size_t e = 0; e < experts.size(); ++e) {
      // Product 2e reads input e; product 2e + 1 too for even e (shared), the next input otherwise.
      for (size_t half = 0; half < 2; ++half) {
        const size_t in = half == 1 && e % 2 == 1 ? (e + 1) % experts.size() : e;
        const int64_t rows_in = static_cast<int64_t>(inputs[in].size()) / cols;
        const TensorView& w = experts[(e + half) % experts.size()].view;
        const size_t p = 2 * e + half;
        together[p].assign(static_cast<size_t>(rows_in * w.rows()), std::numeric_limits<float>::quiet_NaN());
        alone[p].assign(together[p].size(), 0.0f);
        tasks.push_back({&w, inputs[in].data(), rows_in, together[p].data()});
        matmul(w, inputs[in].data(), rows_in, alone[p].data());
      }
    }
    matmul_tasks(tasks);
    for (size_t p = 0; p < tasks.size(); ++p)
      EXPECT_EQ(together[p], alone[p]) << "product " << p << " on " << isa_name(isa);
  }
}

}  // namespace
}  // namespace kvserve
