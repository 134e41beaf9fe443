// The Walsh-Hadamard rotation around quantized K/V caches: the fast transform
// against the plain matrix product, its algebra (an involution that keeps dot
// products), which caches rotate by how much, and what it buys: a q8_0 round
// trip of a vector with an outlier loses far less after rotating.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/hadamard.h"
#include "kernels/kv_quant.h"
#include "test_util.h"

using namespace kvserve;
using ::kvserve::test_util::random_vector;
using ::kvserve::test_util::relative_error;

namespace {

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// x through q8_0 and back, optionally rotated before and turned back after.
std::vector<float> q8_round_trip(std::vector<float> x, int64_t rotation) {
  const auto n = static_cast<int64_t>(x.size());
  if (rotation > 0) hadamard_rotate(x.data(), n, rotation);
  std::vector<uint8_t> stored(kv_head_bytes(KVType::Q8_0, n));
  quantize_kv_row(KVType::Q8_0, x.data(), stored.data(), n);
  std::vector<float> y(x.size());
  dequantize_kv_row_scalar(KVType::Q8_0, stored.data(), y.data(), n);
  if (rotation > 0) hadamard_rotate(y.data(), n, rotation);
  return y;
}

}  // namespace

TEST(Hadamard, FastTransformMatchesTheMatrixProduct) {
  std::mt19937 rng(5);
  for (int64_t block : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512})
    for (int64_t blocks : {1, 3}) {
      const int64_t n = block * blocks;
      std::vector<float> x = random_vector(static_cast<size_t>(n), rng, 1.7f), want(x.size());
      hadamard_rotate_reference(x.data(), want.data(), n, block);
      hadamard_rotate(x.data(), n, block);
      EXPECT_LT(relative_error(x, want), 1e-6) << "block " << block << " n " << n;
    }
}

TEST(Hadamard, RotatingTwiceGivesBackTheVectorAndDotProductsStay) {
  std::mt19937 rng(11);
  for (int64_t block : {32, 64, 128, 256}) {
    const int64_t n = 3 * block;
    const std::vector<float> q = random_vector(static_cast<size_t>(n), rng, 0.9f);
    const std::vector<float> k = random_vector(static_cast<size_t>(n), rng, 2.3f);
    std::vector<float> rq = q, rk = k;
    hadamard_rotate(rq.data(), n, block);
    hadamard_rotate(rk.data(), n, block);
    EXPECT_NEAR(dot(rq, rk), dot(q, k), 1e-4 * std::sqrt(dot(q, q) * dot(k, k))) << "block " << block;
    EXPECT_GT(relative_error(rk, k), 0.5) << "the rotation moved the vector";
    hadamard_rotate(rk.data(), n, block);
    EXPECT_LT(relative_error(rk, k), 1e-6) << "block " << block;
  }
}

TEST(Hadamard, RejectsBlocksThatAreNotPowersOfTwoDividingTheRow) {
  std::vector<float> x(96, 1.0f);
  EXPECT_THROW(hadamard_rotate(x.data(), 96, 48), Error);
  EXPECT_THROW(hadamard_rotate(x.data(), 96, 64), Error);
  EXPECT_THROW(hadamard_rotate(x.data(), 96, 0), Error);
  std::vector<float> y(96);
  EXPECT_THROW(hadamard_rotate_reference(x.data(), y.data(), 96, 12), Error);
}

TEST(Hadamard, OnlyIntegerBlockCachesRotate) {
  for (KVType type : {KVType::F32, KVType::F16, KVType::BF16, KVType::FP8}) {
    EXPECT_FALSE(kv_rotation(type, 64).any());
    EXPECT_FALSE(mla_kv_rotation(type, 576, 512).any());
  }
  for (KVType type : {KVType::Q8_0, KVType::Q4_0}) {
    struct Head {
      int64_t size, keys, values;
    };
    for (const Head& h : {Head{64, 64, 64}, Head{128, 128, 64}, Head{256, 256, 64}, Head{96, 32, 32}}) {
      const KVRotation r = kv_rotation(type, h.size);
      EXPECT_EQ(r.keys, h.keys) << "head " << h.size;
      EXPECT_EQ(r.values, h.values) << "head " << h.size;
    }
    // DeepSeek-V2's latent rows: 512 latent + 64 RoPE values, V the first 512.
    const KVRotation latent = mla_kv_rotation(type, 576, 512);
    EXPECT_EQ(latent.keys, 64);
    EXPECT_EQ(latent.values, 64);
  }
}

TEST(Hadamard, RotationSpreadsAnOutlierOverTheBlock) {
  // A key like Qwen2's: ordinary values and two dimensions forty times larger (a bias turned by RoPE).
  std::mt19937 rng(3);
  std::vector<float> key = random_vector(64, rng, 1.0f);
  key[5] = 40.0f;
  key[37] = -38.0f;
  const double plain = relative_error(q8_round_trip(key, 0), key);
  const double rotated = relative_error(q8_round_trip(key, 64), key);
  std::printf("q8_0 round trip of a key with outliers: plain %.2e, rotated %.2e\n", plain, rotated);
  EXPECT_LT(rotated, plain / 2);
  // Without outliers the rotation costs nothing worth mentioning.
  const std::vector<float> flat = random_vector(64, rng, 1.0f);
  EXPECT_LT(relative_error(q8_round_trip(flat, 64), flat), 2 * relative_error(q8_round_trip(flat, 0), flat));
}
