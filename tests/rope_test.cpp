// RopeTable (kernels/rope.h) against the plain rope() of kernels/ops.h and a
// direct float64 formula with Llama 3 frequency factors and linear position
// scaling, and how ModelConfig reads (or refuses) RoPE scaling metadata.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "test_util.h"

using namespace kvserve;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A minimal llama GGUF: what ModelConfig reads, plus `extra` keys and tensors.
std::string write_config_file(const test_util::TempFile& file, const std::function<void(GGUFWriter&)>& extra) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.embedding_length", 64);
  w.set_u32("llama.attention.head_count", 4);
  w.set_u32("llama.feed_forward_length", 96);
  w.set_u32("llama.context_length", 128);
  w.add_f32_tensor("token_embd.weight", {64, 10}, std::vector<float>(640, 0.5f));
  extra(w);
  w.write(file.path());
  return file.path();
}

}  // namespace

TEST(Rope, UnscaledTableRotatesBitForBitAsTheReference) {
  for (bool neox : {false, true})
    for (auto [heads, head_dim, rot] : {std::tuple{3, 10, 10}, {5, 12, 8}, {2, 64, 64}}) {
      const RopeTable table({rot, 100000.0, neox, {}, 1.0});
      std::vector<float> cs(static_cast<size_t>(rot));
      for (int64_t pos : {0, 1, 7, 999, 32767}) {
        std::vector<float> a = random_values(static_cast<size_t>(heads * head_dim), static_cast<uint32_t>(pos + rot)), b = a;
        rope(a.data(), heads, head_dim, rot, pos, 100000.0f, neox);
        table.angles(pos, cs.data());
        table.apply(b.data(), heads, head_dim, cs.data());
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "neox " << neox << " pos " << pos << " i " << i;
      }
    }
}

TEST(Rope, FrequencyFactorsAndLinearScalingFollowTheFormula) {
  const int64_t heads = 3, head_dim = 16, rot = 12;
  std::vector<float> factors = {1.0f, 1.0f, 1.5f, 2.0f, 4.0f, 8.0f};
  for (bool neox : {false, true}) {
    const RopeTable table({rot, 500000.0, neox, factors, 0.25});
    std::vector<float> cs(rot);
    const int64_t pos = 1234;
    std::vector<float> x = random_values(heads * head_dim, 7), y = x;
    table.angles(pos, cs.data());
    table.apply(y.data(), heads, head_dim, cs.data());
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < rot / 2; ++i) {
        const double angle = 0.25 * pos * std::pow(500000.0, -2.0 * i / rot) / factors[static_cast<size_t>(i)];
        const int64_t a = h * head_dim + (neox ? i : 2 * i), b = h * head_dim + (neox ? i + rot / 2 : 2 * i + 1);
        EXPECT_NEAR(y[a], x[a] * std::cos(angle) - x[b] * std::sin(angle), 1e-5);
        EXPECT_NEAR(y[b], x[a] * std::sin(angle) + x[b] * std::cos(angle), 1e-5);
      }
    for (int64_t i = rot; i < head_dim; ++i) EXPECT_EQ(y[i], x[i]) << "unrotated dims stay";
  }
  EXPECT_THROW(RopeTable({rot, 10000.0, false, {1.0f, 2.0f}}), Error);
  EXPECT_THROW(RopeTable({rot, 10000.0, false, {1, 1, 1, 1, 1, 0}}), Error);
}

TEST(RopeConfig, ReadsLlama3FactorsAndLinearScaling) {
  test_util::TempFile file(".gguf");
  const std::vector<float> factors = {1, 1, 2, 3, 5, 8, 13, 21};  // head_dim 16: 8 pairs
  write_config_file(file, [&](GGUFWriter& w) { w.add_f32_tensor("rope_freqs.weight", {8}, factors); });
  ModelConfig c = ModelConfig::from_gguf(GGUFFile(file.path()));
  EXPECT_EQ(c.rope_freq_factors, factors);
  EXPECT_EQ(c.rope_position_scale, 1.0);

  write_config_file(file, [](GGUFWriter& w) {
    w.set_string("llama.rope.scaling.type", "linear");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
  });
  c = ModelConfig::from_gguf(GGUFFile(file.path()));
  EXPECT_EQ(c.rope_position_scale, 0.25);
  EXPECT_TRUE(c.rope_freq_factors.empty());
}

TEST(RopeConfig, RefusesWhatItWouldComputeWrong) {
  test_util::TempFile file(".gguf");
  const auto message_of = [&](const std::function<void(GGUFWriter&)>& extra) {
    write_config_file(file, extra);
    try {
      ModelConfig::from_gguf(GGUFFile(file.path()));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_NE(message_of([](GGUFWriter& w) { w.set_string("llama.rope.scaling.type", "yarn"); }).find("'yarn' is not supported"),
            std::string::npos);
  EXPECT_NE(message_of([](GGUFWriter& w) {
              w.set_string("llama.rope.scaling.type", "linear");
              w.set_f32("llama.rope.scaling.factor", 0.0f);
            }).find("must be positive"),
            std::string::npos);
  EXPECT_NE(message_of([](GGUFWriter& w) { w.add_f32_tensor("rope_freqs.weight", {5}, {1, 1, 1, 1, 1}); }).find("rope_freqs.weight must hold 8"),
            std::string::npos);
  EXPECT_NE(message_of([](GGUFWriter& w) { w.add_f32_tensor("rope_freqs.weight", {8}, {1, 1, 1, -1, 1, 1, 1, 1}); }).find("not positive"),
            std::string::npos);
}
