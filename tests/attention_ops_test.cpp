// The attention inner loop's ops (kernels/kv_quant.h AttentionVectorOps):
// the softmax's polynomial exp (kernels/fast_exp.h) within 2 ulp of exp, its
// edges, and the SIMD lanes giving the scalar reference's bits (scale_max /
// exp_sum of every ISA on awkward lengths); the f16 / bf16 accumulation equal
// to dequantizing (f16 / bf16 scores: key_lanes_test.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/fast_exp.h"
#include "kernels/kv_quant.h"
#include "isa_util.h"
#include "test_util.h"

using namespace kvserve;

namespace {

int64_t ulp_distance(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) - static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

float exact_exp(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

}  // namespace

TEST(FastExp, WithinTwoUlpOfExp) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(fast_exp::kMinInput, fast_exp::kMaxInput), near(-20.0f, 0.0f);
  int64_t worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 ? wide(rng) : near(rng);  // softmax inputs are mostly just below 0
    worst = std::max(worst, ulp_distance(fast_exp::exp_scalar(x), exact_exp(x)));
  }
  EXPECT_LE(worst, 2);
  for (float x : {0.0f, -0.0f, -1e-30f, 1e-30f, -0.5f, -1.0f, -10.0f, -87.0f, fast_exp::kMinInput, 88.0f})
    EXPECT_LE(ulp_distance(fast_exp::exp_scalar(x), exact_exp(x)), 2) << x;
  EXPECT_EQ(fast_exp::exp_scalar(0.0f), 1.0f);
}

TEST(FastExp, EdgesAreZeroInfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fast_exp::exp_scalar(-inf), 0.0f);
  EXPECT_EQ(fast_exp::exp_scalar(-88.0f), 0.0f);  // below FLT_MIN: flushed
  EXPECT_EQ(fast_exp::exp_scalar(-1e30f), 0.0f);
  EXPECT_EQ(fast_exp::exp_scalar(89.0f), inf);
  EXPECT_EQ(fast_exp::exp_scalar(inf), inf);
  EXPECT_TRUE(std::isnan(fast_exp::exp_scalar(std::numeric_limits<float>::quiet_NaN())));
}

TEST(FastExp, EveryIsaGivesTheScalarBits) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> score(-30.0f, 30.0f);
  const AttentionVectorOps& ref = scalar_attention_vector_ops();
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 200}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = score(rng);
    if (n > 1) x[0] = -std::numeric_limits<float>::infinity();  // a masked score
    auto want = x;
    const float want_max = ref.scale_max(want.data(), n, 0.125f);
    const float want_sum = ref.exp_sum(want.data(), n, want_max);
    test_util::for_each_isa([&] {
      const AttentionVectorOps& ops = attention_vector_ops();
      auto got = x;
      ASSERT_EQ(ops.scale_max(got.data(), n, 0.125f), want_max) << isa_name(active_isa()) << " n " << n;
      const float sum = ops.exp_sum(got.data(), n, want_max);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j]))
            << isa_name(active_isa()) << " n " << n << " j " << j;
      EXPECT_NEAR(sum, want_sum, 1e-6f * want_sum) << isa_name(active_isa()) << " n " << n;  // lanes sum in another order
    });
  }
}

// The f16 / bf16 attention ops that widen rows as they load give the bits of
// dequantizing the rows first and running the f32 ops (ISAs that have them).
TEST(HalfKeyOps, WidenedAsLoadedEqualsDequantizedFirst) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (KVType type : {KVType::F16, KVType::BF16}) {
    for (int64_t n : {8, 13, 16, 24, 48, 64, 80, 100}) {
      for (int n_rows = 1; n_rows <= kAttentionRowsPerCall; ++n_rows) {
        const int64_t n_keys = 37;
        std::vector<std::vector<uint8_t>> stored(static_cast<size_t>(n_keys), std::vector<uint8_t>(kv_head_bytes(type, n)));
        std::vector<std::vector<float>> widened(static_cast<size_t>(n_keys), std::vector<float>(static_cast<size_t>(n)));
        std::vector<const uint16_t*> half(static_cast<size_t>(n_keys));
        std::vector<const float*> full(static_cast<size_t>(n_keys));
        for (int64_t j = 0; j < n_keys; ++j) {
          std::vector<float> x(static_cast<size_t>(n));
          for (float& v : x) v = normal(rng);
          quantize_kv_row(type, x.data(), stored[j].data(), n);
          dequantize_kv_row_scalar(type, stored[j].data(), widened[j].data(), n);
          half[j] = reinterpret_cast<const uint16_t*>(stored[j].data());
          full[j] = widened[j].data();
        }
        std::vector<std::vector<float>> p(4, std::vector<float>(n_keys));
        for (auto& row : p) for (float& v : row) v = std::abs(normal(rng));
        const float* ps[4] = {p[0].data(), p[1].data(), p[2].data(), p[3].data()};
        test_util::for_each_isa([&] {
          const AttentionVectorOps& ops = attention_vector_ops();
          if (!ops.axpy_keys_half) return;
          std::vector<std::vector<float>> ya(4, std::vector<float>(static_cast<size_t>(n), 0.5f)), yb = ya;
          float* yas[4] = {ya[0].data(), ya[1].data(), ya[2].data(), ya[3].data()};
          float* ybs[4] = {yb[0].data(), yb[1].data(), yb[2].data(), yb[3].data()};
          ops.axpy_keys_half(type, ps, n_rows, half.data(), n_keys, yas, n);
          ops.axpy_keys(ps, n_rows, full.data(), n_keys, ybs, n);
          for (int r = 0; r < n_rows; ++r)
            for (int64_t i = 0; i < n; ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(ya[r][i]), std::bit_cast<uint32_t>(yb[r][i])) << "axpy " << n << " " << r;
        });
      }
    }
  }
}

// dot_keys reduces several keys at once (8 on AVX2, 16 on AVX-512) where a
// lone key has a reduction of its own: every key must get the bits of dot on
// that key alone, or a row's scores would depend on the tile's key count
// (prefill against decode, batch invariance).
TEST(KeyOps, ManyKeysAtOnceGiveEachKeysOwnBits) {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {8, 13, 16, 24, 48, 64, 80, 100, 128}) {
    for (int64_t n_keys : {5, 16, 37, 64}) {
      std::vector<std::vector<float>> keys(static_cast<size_t>(n_keys), std::vector<float>(static_cast<size_t>(n)));
      std::vector<const float*> k(static_cast<size_t>(n_keys));
      for (int64_t j = 0; j < n_keys; ++j) {
        for (float& v : keys[j]) v = normal(rng);
        k[j] = keys[j].data();
      }
      std::vector<std::vector<float>> q(4, std::vector<float>(static_cast<size_t>(n)));
      for (auto& row : q) for (float& v : row) v = normal(rng);
      const float* qs[4] = {q[0].data(), q[1].data(), q[2].data(), q[3].data()};
      test_util::for_each_isa([&] {
        const AttentionVectorOps& ops = attention_vector_ops();
        for (int n_rows = 1; n_rows <= kAttentionRowsPerCall; ++n_rows) {
          std::vector<std::vector<float>> got(4, std::vector<float>(static_cast<size_t>(n_keys)));
          float* outs[4] = {got[0].data(), got[1].data(), got[2].data(), got[3].data()};
          ops.dot_keys(qs, n_rows, k.data(), n_keys, n, outs);
          for (int r = 0; r < n_rows; ++r)
            for (int64_t j = 0; j < n_keys; ++j)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[r][j]), std::bit_cast<uint32_t>(ops.dot(qs[r], k[j], n)))
                  << isa_name(active_isa()) << " n " << n << " keys " << n_keys << " rows " << n_rows << " row " << r
                  << " key " << j;
        }
      });
    }
  }
}
