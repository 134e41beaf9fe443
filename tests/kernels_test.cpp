// Kernel tests: every matmul path against the scalar reference, hand-checked
// quantization blocks, and the row ops against double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"

namespace kvserve {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// A weight matrix quantized row by row, plus its exact dequantized values.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;
  TensorView view;
};

TestMatrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestMatrix m;
  const std::vector<float> values = random_floats(static_cast<size_t>(rows * cols), seed);
  const size_t row_bytes = dtype_row_bytes(type, cols);
  m.bytes.resize(row_bytes * static_cast<size_t>(rows));
  m.dequantized.resize(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, values.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
    dequantize_row(type, m.bytes.data() + r * row_bytes, m.dequantized.data() + r * cols, cols);
  }
  m.view.name = "test";
  m.view.type = type;
  m.view.n_dims = 2;
  m.view.ne = {cols, rows, 1, 1};
  m.view.data = m.bytes.data();
  m.view.nbytes = m.bytes.size();
  return m;
}

// Restores the dispatch choice when a test that switches paths ends.
class IsaGuard {
 public:
  IsaGuard() : saved_(active_isa()) {}
  ~IsaGuard() { set_kernel_isa(saved_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  Isa saved_;
};

// Allowed |error| relative to sum_c |w[r,c]| |x[c]|. Quantized types also
// quantize the activations to 8 bits (per-element error up to max|x| / 254).
double tolerance(DType type) {
  switch (type) {
    case DType::F32: return 1e-5;
    case DType::F16:
    case DType::BF16: return 1e-3;
    default: return 1e-2;
  }
}

struct Shape {
  int64_t rows, cols, n_tokens;
};

std::vector<Shape> awkward_shapes() {
  std::vector<Shape> shapes;
  for (int64_t rows : {1, 7, 33, 100})
    for (int64_t cols : {32, 64, 96, 4128})
      for (int64_t n_tokens : {1, 3, 5, 17}) shapes.push_back({rows, cols, n_tokens});
  return shapes;
}

std::string describe(DType type, Isa isa, const Shape& s) {
  return std::string(dtype_name(type)) + " on " + isa_name(isa) + ", rows " + std::to_string(s.rows) + ", cols " +
         std::to_string(s.cols) + ", tokens " + std::to_string(s.n_tokens);
}

class KernelMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(KernelMatmul, EveryPathMatchesReferenceOnAwkwardShapes) {
  const DType type = GetParam();
  IsaGuard guard;
  uint32_t seed = 1;
  for (const Shape& s : awkward_shapes()) {
    const TestMatrix m = make_matrix(type, s.rows, s.cols, seed++);
    const std::vector<float> x = random_floats(static_cast<size_t>(s.n_tokens * s.cols), seed++);
    std::vector<float> expected(static_cast<size_t>(s.n_tokens * s.rows));
    matmul_reference(m.view, x.data(), s.n_tokens, expected.data());
    for (Isa isa : available_isas()) {
      set_kernel_isa(isa);
      std::vector<float> y(expected.size(), std::numeric_limits<float>::quiet_NaN());
      matmul(m.view, x.data(), s.n_tokens, y.data());
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        for (int64_t r = 0; r < s.rows; ++r) {
          double magnitude = 0;
          for (int64_t c = 0; c < s.cols; ++c)
            magnitude += std::fabs(m.dequantized[r * s.cols + c]) * std::fabs(x[t * s.cols + c]);
          const size_t i = static_cast<size_t>(t * s.rows + r);
          ASSERT_NEAR(y[i], expected[i], tolerance(type) * magnitude)
              << describe(type, isa, s) << ", token " << t << ", row " << r;
        }
      }
    }
  }
}

// The SIMD paths compute exactly what the scalar table does (same quantized
// activations, same integer dots); only the float summation order differs.
TEST_P(KernelMatmul, SimdPathsAgreeWithScalarPathClosely) {
  const DType type = GetParam();
  IsaGuard guard;
  uint32_t seed = 1000;
  for (const Shape& s : awkward_shapes()) {
    const TestMatrix m = make_matrix(type, s.rows, s.cols, seed++);
    const std::vector<float> x = random_floats(static_cast<size_t>(s.n_tokens * s.cols), seed++);
    std::vector<float> scalar(static_cast<size_t>(s.n_tokens * s.rows));
    set_kernel_isa(Isa::Scalar);
    matmul(m.view, x.data(), s.n_tokens, scalar.data());
    for (Isa isa : available_isas()) {
      set_kernel_isa(isa);
      std::vector<float> y(scalar.size());
      matmul(m.view, x.data(), s.n_tokens, y.data());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], scalar[i], 1e-5 * (1.0 + std::fabs(scalar[i]) + std::sqrt(static_cast<double>(s.cols))))
            << describe(type, isa, s) << ", output " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KernelTypes, KernelMatmul,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

TEST(KernelMatmulErrors, UnsupportedTypeThrows) {
  std::vector<uint8_t> bytes(144);
  TensorView w;
  w.type = DType::Q4_K;
  w.n_dims = 2;
  w.ne = {256, 1, 1, 1};
  w.data = bytes.data();
  std::vector<float> x(256, 1.0f), y(1);
  EXPECT_THROW(matmul(w, x.data(), 1, y.data()), Error);
}

// ---- Dispatch ------------------------------------------------------------

TEST(KernelDispatch, NamesRoundTripAndUnknownNamesThrow) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  EXPECT_THROW(parse_isa("sse2"), Error);
  EXPECT_THROW(parse_isa(""), Error);
}

TEST(KernelDispatch, SetKernelIsaSwitchesActivePath) {
  IsaGuard guard;
  ASSERT_TRUE(isa_available(Isa::Scalar));
  EXPECT_EQ(available_isas().front(), Isa::Scalar);
  EXPECT_TRUE(isa_available(best_isa()));
  for (Isa isa : available_isas()) {
    set_kernel_isa(isa);
    EXPECT_EQ(active_isa(), isa);
  }
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    if (!isa_available(isa)) {
      EXPECT_THROW(set_kernel_isa(isa), Error);
    }
}

TEST(KernelDispatch, CpuFeaturesAreConsistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512bw || f.avx512vl || f.avx512vnni || f.avx512dq) {
    EXPECT_TRUE(f.avx512f);
  }
  if (isa_available(Isa::Avx512)) {
    EXPECT_TRUE(f.avx512vnni && f.avx2);
  }
  if (isa_available(Isa::Avx2)) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
}

}  // namespace
}  // namespace kvserve
