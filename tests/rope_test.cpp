// RopeTable (kernels/rope.h) against the plain rope() of kernels/ops.h and a
// direct float64 formula with Llama 3 frequency factors and linear position
// scaling, and how ModelConfig reads (or refuses) RoPE scaling metadata.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "decode/decoder.h"
#include "model/config.h"
#include "model/model.h"
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

// ggml's rope_yarn written out plainly (float, as ggml computes): the
// independent check of RopeTable's folding of YaRN into per-pair frequencies.
void ggml_yarn_cos_sin(int64_t pos, int64_t n_dims, float base, float freq_scale, int64_t n_ctx_orig, float mscale,
                       std::vector<float>& cs) {
  const auto corr_dim = [&](float n_rot) {
    return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * 3.14159265358979f)) /
           (2.0f * std::log(base));
  };
  const float low = std::max(0.0f, std::floor(corr_dim(32.0f)));
  const float high = std::min(static_cast<float>(n_dims - 1), std::ceil(corr_dim(1.0f)));
  cs.assign(static_cast<size_t>(n_dims), 0.0f);
  for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
    const double extrap = static_cast<double>(pos) * std::pow(static_cast<double>(base), -static_cast<double>(i0) / n_dims);
    const double interp = freq_scale * extrap;
    const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
    const double ramp = 1.0 - std::min(1.0f, std::max(0.0f, y));
    const double theta = interp * (1.0 - ramp) + extrap * ramp;
    const float m = mscale * (1.0f + 0.1f * std::log(1.0f / freq_scale));
    cs[static_cast<size_t>(i0)] = static_cast<float>(std::cos(theta)) * m;
    cs[static_cast<size_t>(i0) + 1] = static_cast<float>(std::sin(theta)) * m;
  }
}

// A YaRN file (factor 4 over an original context of 32): the config reads it
// as llama.cpp does (magnitude 1 + 0.1 ln 4, context extended to 4 x 32 when
// the file said less), and the table's cos / sin follow ggml's formula at
// positions inside and far past the original context.
TEST(RopeConfig, ReadsYarnAndRotatesAsGgml) {
  test_util::TempFile file(".gguf");
  write_config_file(file, [](GGUFWriter& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
    w.set_u32("llama.rope.scaling.original_context_length", 100);
    w.set_f32("llama.rope.freq_base", 10000.0f);
  });
  const ModelConfig c = ModelConfig::from_gguf(GGUFFile(file.path()));
  EXPECT_EQ(c.rope_position_scale, 0.25);
  EXPECT_EQ(c.rope_yarn.ext_factor, 1.0);
  EXPECT_EQ(c.rope_yarn.original_context, 100);
  EXPECT_EQ(c.context_length, 400);  // the file's 128 extended to 4 x 100
  EXPECT_NEAR(c.rope_magnitude, 1.0 + 0.1 * std::log(4.0), 1e-12);
  const RopeTable table(c.rope_params());
  std::vector<float> got(16), want;
  for (int64_t pos : {0, 1, 7, 99, 100, 250, 399}) {
    table.angles(pos, got.data());
    // ggml's mscale argument is llama.cpp's yarn_attn_factor: the magnitude over its own 1 + 0.1 ln(factor).
    ggml_yarn_cos_sin(pos, 16, 10000.0f, 0.25f, 100, static_cast<float>(c.rope_magnitude / (1.0 + 0.1 * std::log(4.0))), want);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-5) << "pos " << pos << " value " << i;
  }
  // Some pairs are interpolated, some kept: the ramp is not all 0 or all 1.
  const std::vector<double> m = yarn_pair_multipliers(c.rope_params());
  EXPECT_EQ(m.front(), 4.0);  // pair 0, the highest frequency, keeps its trained angle: interpolated x 4
  EXPECT_EQ(m.back(), 1.0);    // the lowest frequency is interpolated
  EXPECT_GT(m[1], 1.0);  // pairs 1 and 2 blend (the ramp runs over pairs 0..3 here)
  EXPECT_LT(m[1], 4.0);
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
  EXPECT_NE(message_of([](GGUFWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); }).find("'longrope' is not supported"),
            std::string::npos);
  EXPECT_NE(message_of([](GGUFWriter& w) {
              w.set_string("llama.rope.scaling.type", "yarn");
              w.set_f32("llama.rope.scaling.factor", 4.0f);
              w.set_u32("llama.rope.scaling.original_context_length", 0);
            }).find("original_context_length 0 is out of range"),
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

// --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64 on tiny-qwen3 (no
// scaling in its file) computes what tiny-qwen3-yarn (the same weights with
// that YaRN in its metadata, checked against llama.cpp) computes, bit for bit;
// "none" on the YaRN file gives back plain tiny-qwen3.
TEST(RopeConfig, CommandLineScalingReplacesTheFiles) {
  test_util::TempFile plain(".gguf"), yarn(".gguf");
  test_util::write_synth_model(plain.path(), "tiny-qwen3", DType::F32, 3);
  test_util::write_synth_model(yarn.path(), "tiny-qwen3-yarn", DType::F32, 3);
  const auto logits = [](const std::string& path, std::optional<RopeScalingOverride> rope) {
    ModelLoadOptions o;
    o.rope_scaling = rope;
    auto m = Model::load(path, o);
    auto d = make_decoder("cached", *m, 256);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 180; ++i) prompt.push_back((i * 7919 + 5) % 370);
    const std::span<const float> out = d->append(prompt);
    return std::make_pair(std::vector<float>(out.begin(), out.end()), m->config().context_length);
  };
  const auto [scaled, scaled_context] = logits(plain.path(), RopeScalingOverride{"yarn", 4.0, 64});
  const auto [file, file_context] = logits(yarn.path(), std::nullopt);
  EXPECT_EQ(scaled, file);
  EXPECT_EQ(scaled_context, 256);
  EXPECT_EQ(file_context, 256);
  const auto [unscaled, unscaled_context] = logits(yarn.path(), RopeScalingOverride{"none", 1.0, 0});
  EXPECT_EQ(unscaled, logits(plain.path(), std::nullopt).first);
  EXPECT_NE(unscaled, file);
  EXPECT_THROW(logits(plain.path(), RopeScalingOverride{"yarn", 0.0, 0}), Error);
  EXPECT_THROW(logits(plain.path(), RopeScalingOverride{"longrope", 2.0, 0}), Error);
  // Through the command line: the flags reach the model (and a factor without a type is refused).
  const auto run = test_util::run_kvserve("run -m " + plain.path() +
                                          " -p hello -n 2 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 64");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const auto bad = test_util::run_kvserve("run -m " + plain.path() + " -p hello -n 2 --rope-scale 4");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("need --rope-scaling"), std::string::npos) << bad.output;
}
