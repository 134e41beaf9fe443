// The float GEMM over repacked f32 / f16 / bf16 weights (kernels/float_packed.h):
// every SIMD path equals matmul_float_reference bit for bit on random data of
// awkward shapes (rows and columns not multiples of the row group, the
// micro-tile or the cache blocks) and token counts (decode, every micro-tile
// remainder, several K blocks and token tiles), on one and two threads and in
// both activation modes; and the reference is within float rounding of
// matmul_reference (dequantize + dot).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/dispatch.h"
#include "kernels/float_packed.h"
#include "kernels/matmul.h"
#include "quant_matrix.h"
#include "test_util.h"

namespace kvserve {
namespace {

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

// Random non-zero weights in the type's own encoding, original and repacked.
struct FloatMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // exactly what the bytes hold
  AlignedBuffer<uint8_t> packed;
  TensorView original, view;  // view: original with .packed set
};

// Magnitudes spread over several binades (and f16 subnormals), random signs.
float random_weight(std::mt19937& rng) {
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::uniform_int_distribution<int> binade(-16, 2), sign(0, 1);
  return (sign(rng) ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), binade(rng));
}

FloatMatrix make_float_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  FloatMatrix m;
  const size_t bytes = type == DType::F32 ? 4 : 2;
  m.bytes.resize(bytes * static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float w = random_weight(rng);
    uint8_t* at = m.bytes.data() + bytes * static_cast<size_t>(i);
    if (type == DType::F32) std::memcpy(at, &w, 4);
    const uint16_t h = type == DType::F16 ? f32_to_fp16(w) : f32_to_bf16(w);
    if (type != DType::F32) std::memcpy(at, &h, 2);
    m.values.push_back(type == DType::F32 ? w : type == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h));
  }
  m.original.name = "test";
  m.original.type = type;
  m.original.n_dims = 2;
  m.original.ne = {cols, rows, 1, 1};
  m.original.data = m.bytes.data();
  m.original.nbytes = m.bytes.size();
  m.packed.resize(float_packed_matrix_bytes(type, rows, cols));
  repack_float_rows8(m.original, m.packed.data());
  m.view = m.original;
  m.view.packed = m.packed.data();
  return m;
}

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : available_isas())
    if (isa != Isa::Scalar) out.push_back(isa);
  return out;
}

// "" when a and b hold the same bits, else the first difference.
std::string bitwise_diff(const std::vector<float>& got, const std::vector<float>& want, int64_t rows) {
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return "token " + std::to_string(static_cast<int64_t>(i) / rows) + " row " +
             std::to_string(static_cast<int64_t>(i) % rows) + ": got " + std::to_string(got[i]) + " want " +
             std::to_string(want[i]);
  return "";
}

std::vector<float> run_matmul(const TensorView& w, const std::vector<float>& x, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n * w.rows()), -1.0f);
  matmul(w, x.data(), n, y.data());
  return y;
}

class FloatPackedMatmul : public ::testing::TestWithParam<DType> {};

// Decode, small batches and micro-tile remainders: one K block.
TEST_P(FloatPackedMatmul, SimdPathsMatchTheReferenceBitwise) {
  const DType type = GetParam();
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  uint32_t seed = 1;
  for (int64_t rows : {1, 7, 8, 9, 17, 33})
    for (int64_t cols : {1, 3, 13, 100})
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 11, 13}) {
        const FloatMatrix m = make_float_matrix(type, rows, cols, seed++);
        std::mt19937 rng(seed);
        const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
        std::vector<float> want(static_cast<size_t>(n * rows));
        matmul_float_reference(m.original, x.data(), n, want.data());
        for (Isa isa : simd_isas()) {
          set_kernel_isa(isa);
          ASSERT_EQ(bitwise_diff(run_matmul(m.view, x, n), want, rows), "")
              << dtype_name(type) << " on " << isa_name(isa) << ", rows " << rows << ", cols " << cols << ", tokens " << n;
        }
      }
}

// Prefill: several K blocks and token tiles, one and two threads, both
// activation modes (float weights never round x).
TEST_P(FloatPackedMatmul, CacheBlocksThreadsAndActivationModesChangeNoBit) {
  const DType type = GetParam();
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  const int64_t rows = 75, cols = 1030;
  const int64_t token_counts[] = {40, test_util::skip_slow() ? 140 : 300};
  for (int64_t n : token_counts) {
    const FloatMatrix m = make_float_matrix(type, rows, cols, static_cast<uint32_t>(n));
    std::mt19937 rng(7);
    const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
    std::vector<float> want(static_cast<size_t>(n * rows));
    matmul_float_reference(m.original, x.data(), n, want.data());
    const int threads = omp_get_max_threads();
    for (Isa isa : simd_isas()) {
      set_kernel_isa(isa);
      for (ActivationPrecision p : {ActivationPrecision::kQ8, ActivationPrecision::kF32}) {
        set_activation_precision(p);
        for (int t : {1, 2}) {
          omp_set_num_threads(t);
          EXPECT_EQ(bitwise_diff(run_matmul(m.view, x, n), want, rows), "")
              << dtype_name(type) << " on " << isa_name(isa) << ", " << n << " tokens, " << t << " threads, "
              << activation_precision_name(p) << " activations";
        }
      }
    }
    omp_set_num_threads(threads);
  }
}

// A row's result is the same bits alone as inside any batch.
TEST_P(FloatPackedMatmul, OneTokenEqualsItsRowInABatch) {
  const DType type = GetParam();
  if (simd_isas().empty()) GTEST_SKIP() << "no SIMD kernel table on this CPU";
  test_util::IsaAndPrecisionGuard restore;
  const int64_t rows = 41, cols = 1100, n = 29;
  const FloatMatrix m = make_float_matrix(type, rows, cols, 5);
  std::mt19937 rng(11);
  const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
  for (Isa isa : simd_isas()) {
    set_kernel_isa(isa);
    const std::vector<float> batch = run_matmul(m.view, x, n);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> xt(x.begin() + t * cols, x.begin() + (t + 1) * cols);
      const std::vector<float> alone = run_matmul(m.view, xt, 1);
      const std::vector<float> row(batch.begin() + t * rows, batch.begin() + (t + 1) * rows);
      ASSERT_EQ(bitwise_diff(alone, row, rows), "") << dtype_name(type) << " on " << isa_name(isa) << ", token " << t;
    }
  }
}

// The reference (one fma chain per row and token) against dequantize + dot,
// and the scalar table (original rows, no repacking) within the same bound.
TEST_P(FloatPackedMatmul, ReferenceAndScalarAreWithinRoundingOfF32) {
  const DType type = GetParam();
  test_util::IsaAndPrecisionGuard restore;
  const int64_t rows = 9, cols = 777, n = 3;
  const FloatMatrix m = make_float_matrix(type, rows, cols, 21);
  std::mt19937 rng(3);
  const std::vector<float> x = test_util::random_vector(static_cast<size_t>(n * cols), rng, 1.0f);
  std::vector<float> chain(static_cast<size_t>(n * rows)), want(chain.size());
  matmul_float_reference(m.original, x.data(), n, chain.data());
  matmul_reference(m.original, x.data(), n, want.data());
  set_kernel_isa(Isa::Scalar);
  const std::vector<float> scalar = run_matmul(m.view, x, n);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double magnitude = 0;
      for (int64_t c = 0; c < cols; ++c)
        magnitude += std::fabs(m.values[static_cast<size_t>(r * cols + c)] * x[static_cast<size_t>(t * cols + c)]);
      const size_t i = static_cast<size_t>(t * rows + r);
      EXPECT_LE(std::fabs(chain[i] - want[i]), 1e-5 * magnitude) << dtype_name(type) << " row " << r;
      EXPECT_LE(std::fabs(scalar[i] - want[i]), 1e-5 * magnitude) << dtype_name(type) << " row " << r;
    }
}

// Same bytes per weight as the original: the copy replaces it, it does not grow.
TEST_P(FloatPackedMatmul, RepackedSizeIsTheOriginalsPlusPaddingRows) {
  const DType type = GetParam();
  const size_t value = type == DType::F32 ? 4 : 2;
  EXPECT_EQ(float_packed_matrix_bytes(type, 1536, 576), 1536 * 576 * value);
  EXPECT_EQ(float_packed_matrix_bytes(type, 9, 100), 16 * 100 * value);
  const FloatMatrix m = make_float_matrix(type, 9, 5, 1);
  // Row 8 (group 1, lane 0), column 3; lanes 1..7 of group 1 are zero padding.
  const uint8_t* group1 = m.packed.data() + float_packed_group_bytes(type, 5);
  EXPECT_EQ(std::memcmp(group1 + 3 * 8 * value, m.original.row(8) + 3 * value, value), 0);
  for (size_t lane = 1; lane < 8; ++lane)
    for (size_t b = 0; b < value; ++b) EXPECT_EQ(group1[(3 * 8 + lane) * value + b], 0);
}

INSTANTIATE_TEST_SUITE_P(FloatTypes, FloatPackedMatmul, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

TEST(FloatPacked, QuantizedTypesAreRefused) {
  EXPECT_FALSE(float_weight_type(DType::Q8_0));
  TensorView w;
  w.type = DType::Q8_0;
  w.ne = {32, 8, 1, 1};
  std::vector<uint8_t> out(4096);
  EXPECT_THROW(repack_float_rows8(w, out.data()), Error);
}

}  // namespace
}  // namespace kvserve
