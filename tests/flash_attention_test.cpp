// Flash attention vs the materializing reference, and the online softmax vs a
// two-pass softmax on adversarial rows.
#include <gtest/gtest.h>

#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/ops.h"

using namespace kvserve;

using ::kvserve::test_util::random_vector;
using ::kvserve::test_util::relative_error;

namespace {

struct Case {
  int64_t n_kv;       // context length
  int64_t n_q;        // query rows (the last n_q positions)
  int64_t head_dim;
  int64_t n_kv_heads;
  int64_t group;      // GQA ratio
  int64_t window = 0; // sliding window (0: none)
};

void expect_flash_matches_reference(const Case& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.n_kv * 131 + c.n_q * 7 + c.head_dim + c.group));
  const AttentionShape shape{c.n_kv_heads * c.group, c.n_kv_heads, c.head_dim, c.window};
  const int64_t q_width = shape.n_heads * c.head_dim, kv_width = c.n_kv_heads * c.head_dim;
  // Keys scaled up so that scores spread over a wide range (peaky softmax rows).
  const auto q = random_vector(static_cast<size_t>(c.n_q * q_width), rng, 1.0f);
  const auto k = random_vector(static_cast<size_t>(c.n_kv * kv_width), rng, 2.0f);
  const auto v = random_vector(static_cast<size_t>(c.n_kv * kv_width), rng, 1.0f);
  std::vector<float> want(q.size()), got(q.size(), std::nanf(""));
  const int64_t pos0 = c.n_kv - c.n_q;
  attention_reference(q.data(), c.n_q, pos0, k.data(), v.data(), c.n_kv, kv_width, shape, want.data());
  flash_attention(q.data(), c.n_q, pos0, k.data(), v.data(), c.n_kv, kv_width, shape, got.data());
  EXPECT_LT(relative_error(got, want), 1e-5)
      << "n_kv " << c.n_kv << " n_q " << c.n_q << " head_dim " << c.head_dim << " group " << c.group << " window "
      << c.window;
}

}  // namespace

// Under the sanitizer (skip_slow) the longest cases shrink but still cross
// key tiles (64) and key splits (256).
int64_t long_case(int64_t n) { return test_util::skip_slow() ? std::min<int64_t>(n, 300) : n; }

TEST(FlashAttention, PrefillMatchesReference) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{63}, int64_t{64}, int64_t{65}, long_case(1000)})
    for (int64_t hd : {64, 128})
      for (int64_t group : {1, 4, 8}) expect_flash_matches_reference({n, n, hd, 1, group});
}

TEST(FlashAttention, DecodeMatchesReference) {
  for (int64_t n : {1, 7, 63, 64, 65, 1000, 4097})
    for (int64_t hd : {64, 128})
      for (int64_t group : {1, 4, 8}) expect_flash_matches_reference({n, 1, hd, 2, group});
}

TEST(FlashAttention, ChunkedPrefillAgainstLongContext) {
  // A chunk of queries continuing a long cached prefix (causal offset pos0 > 0).
  for (int64_t group : {1, 4, 8}) expect_flash_matches_reference({long_case(4097), 65, 64, 2, group});
  expect_flash_matches_reference({long_case(4097), 3, 128, 1, 8});
}

// Gemma 3's sliding layers: windows smaller and larger than a key tile (64)
// and a key split (256), prefill, decode and a chunk after a long prefix.
TEST(FlashAttention, SlidingWindowMatchesReference) {
  for (int64_t window : {1, 5, 64, 100, 300, 512})
    for (int64_t n : {1, 65, 700}) {
      const int64_t m = test_util::skip_slow() ? std::min<int64_t>(n, 300) : n;
      expect_flash_matches_reference({m, m, 64, 1, 4, window});
      expect_flash_matches_reference({n, 1, 128, 2, 2, window});
    }
  expect_flash_matches_reference({long_case(4097), 65, 64, 2, 4, 512});
  expect_flash_matches_reference({long_case(4097), 3, 256, 1, 4, 512});
}

TEST(FlashAttention, SlidingWindowSeesOnlyTheWindow) {
  // Window 1: every query sees only its own key, so the output is its value row.
  const AttentionShape shape{2, 1, 32, 1};
  std::mt19937 rng(5);
  const int64_t n = 80;
  const auto q = random_vector(static_cast<size_t>(n * 64), rng, 1.0f);
  const auto k = random_vector(static_cast<size_t>(n * 32), rng, 1.0f);
  const auto v = random_vector(static_cast<size_t>(n * 32), rng, 1.0f);
  std::vector<float> out(q.size());
  flash_attention(q.data(), n, 0, k.data(), v.data(), n, 32, shape, out.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 32; ++d) ASSERT_FLOAT_EQ(out[static_cast<size_t>(i * 64 + h * 32 + d)], v[static_cast<size_t>(i * 32 + d)]);
}

TEST(FlashAttention, OnlineSoftmaxMatchesTwoPass) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {
      {1, 2, 3},
      {1000, 1000, 1000, 1000},            // equal, large
      {-1000, 1000, 0, 999.5f},            // huge spread
      {-inf, 3, -inf, 2},                  // masked entries
      {5, -inf},                           // max first, then masked
      {-inf, -inf, -inf},                  // fully masked row
      {88, 89, -88, 0, 3.4e38f / 1e30f},   // near exp overflow if not shifted
      {-5e30f, 1, -inf, 1},
  };
  for (const auto& row : rows) {
    std::vector<float> two_pass = row, online(row.size());
    softmax(two_pass.data(), static_cast<int64_t>(two_pass.size()));
    online_softmax(row.data(), static_cast<int64_t>(row.size()), online.data());
    for (size_t i = 0; i < row.size(); ++i) {
      EXPECT_FALSE(std::isnan(online[i]));
      EXPECT_NEAR(online[i], two_pass[i], 1e-6) << "entry " << i;
    }
  }
}

TEST(FlashAttention, MergingPartialStatesIsExact) {
  std::mt19937 rng(5);
  const auto x = random_vector(300, rng, 10.0f);
  OnlineSoftmax whole, left, right;
  for (size_t i = 0; i < x.size(); ++i) {
    whole.add(x[i]);
    (i < 123 ? left : right).add(x[i]);
  }
  float a = 0, b = 0;
  left.merge(right, &a, &b);
  EXPECT_FLOAT_EQ(left.max, whole.max);
  EXPECT_NEAR(left.sum, whole.sum, 1e-5 * whole.sum);
}
