// `kvserve quantize`: metadata survives, matrices change type, and a q8_0
// copy of a real model generates the same greedy text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>

#include "core/error.h"
#include "decode/decoder.h"
#include "kernels/quantize.h"
#include "model/llama2c.h"
#include "model/quantize_model.h"
#include "model/synth.h"
#include "sampling/sampler.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

namespace {

std::vector<int32_t> greedy(const Model& m, std::vector<int32_t> prompt, int n) {
  auto d = make_decoder("cached", m, 256);
  std::span<const float> logits = d->append(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    for (float x : logits) EXPECT_TRUE(std::isfinite(x));
    out.push_back(argmax(logits));
    logits = d->append(std::span<const int32_t>(&out.back(), 1));
  }
  return out;
}

// The stored type of a file's tensor (a failure, and f32, when it has none of that name).
DType tensor_type(const GGUFFile& file, const std::string& name) {
  for (const TensorView& t : file.tensors())
    if (t.name == name) return t.type;
  ADD_FAILURE() << "no tensor " << name;
  return DType::F32;
}

// The relative error of a quantized model's logits against its source's, after the same short prompt.
double logits_error(const std::string& source, const std::string& quantized) {
  auto f32 = Model::load(source), q = Model::load(quantized);
  auto a = make_decoder("cached", *f32, 64), b = make_decoder("cached", *q, 64);
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 7};
  const std::span<const float> la = a->append(prompt), lb = b->append(prompt);
  return test_util::relative_error(la, lb);
}

}  // namespace

TEST(Quantize, KeepsMetadataAndConvertsMatrices) {
  TempFile src(".gguf"), dst(".gguf");
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-qwen2");
  const QuantizeReport r = quantize_model(src.path(), dst.path(), DType::Q4_1);
  EXPECT_GT(r.converted, 0);
  GGUFFile a(src.path()), b(dst.path());
  EXPECT_EQ(b.get_uint("general.file_type"), 3u);
  for (const auto& [key, v] : a.metadata()) {
    if (key == "general.file_type") continue;
    const GGUFValue* w = b.find(key);
    ASSERT_NE(w, nullptr) << key;
    EXPECT_EQ(w->type, v.type) << key;
    EXPECT_EQ(w->str, v.str) << key;
    EXPECT_EQ(w->strings, v.strings) << key;
    EXPECT_EQ(w->numbers, v.numbers) << key;
    EXPECT_EQ(w->u, v.u) << key;
  }
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const TensorView& t : b.tensors())
    EXPECT_EQ(t.type, t.n_dims == 2 ? DType::Q4_1 : DType::F32) << t.name;
  auto m = Model::load(dst.path());
  greedy(*m, {1, 2, 3}, 4);
}

TEST(Quantize, Q8CopyOfStories260KGeneratesTheSameGreedyText) {
  const std::string dir = kvserve::test_util::shared_models_dir();
  if (!std::filesystem::exists(dir + "/stories260K.bin")) GTEST_SKIP() << "no stories260K.bin";
  TempFile f32(".gguf"), q8(".gguf"), q4(".gguf");
  Llama2cOptions o;
  o.checkpoint_path = dir + "/stories260K.bin";
  o.tokenizer_path = dir + "/tok512.bin";
  o.output_path = f32.path();
  convert_llama2c(o);
  const QuantizeReport r = quantize_model(f32.path(), q8.path(), DType::Q8_0);
  // ffn_down rows are 172 wide: not whole q8_0 blocks, so they stay f32.
  EXPECT_EQ(r.kept.size(), 5u);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  auto a = Model::load(f32.path());
  auto b = Model::load(q8.path());
  EXPECT_EQ(greedy(*a, prompt, 48), greedy(*b, prompt, 48));
  quantize_model(f32.path(), q4.path(), DType::Q4_0);
  auto c = Model::load(q4.path());
  greedy(*c, prompt, 8);  // q4_0 text differs; its cost is measured as perplexity in docs/performance.md
}

// Q5_0, Q5_1 and IQ4_NL whole models: llama.cpp's file types 8, 9 and 25, every matrix
// converted, and the result closer to the f32 model than Q4_1 (random weights,
// so the first step's logits are far from any trained model's).
TEST(Quantize, Q5ModelsComputeWhatTheF32ModelDoes) {
  TempFile src(".gguf");
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-qwen2", DType::F32);
  auto f32 = Model::load(src.path());
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 250, 7};
  auto a = make_decoder("cached", *f32, 64);
  const std::span<const float> logits = a->append(prompt);
  const std::vector<float> la(logits.begin(), logits.end());
  auto error_of = [&](const char* name, DType type, uint32_t file_type) {
    TempFile dst(".gguf");
    const QuantizeReport r = quantize_model(src.path(), dst.path(), parse_quantize_recipe(name));
    EXPECT_GT(r.converted, 0) << name;
    EXPECT_TRUE(r.kept.empty()) << name;
    const GGUFFile g(dst.path());
    EXPECT_EQ(g.get_uint("general.file_type"), file_type) << name;
    for (const TensorView& t : g.tensors()) EXPECT_EQ(t.type, t.n_dims == 2 ? type : DType::F32) << name << " " << t.name;
    auto q = Model::load(dst.path());
    auto b = make_decoder("cached", *q, 64);
    return test_util::relative_error(std::span<const float>(la), b->append(prompt));
  };
  const double q4_1 = error_of("q4_1", DType::Q4_1, 3), q5_0 = error_of("q5_0", DType::Q5_0, 8),
               q5_1 = error_of("q5_1", DType::Q5_1, 9), iq4_nl = error_of("iq4_nl", DType::IQ4_NL, 25);
  std::printf("relative logit error: q4_1 %.3f, q5_0 %.3f, q5_1 %.3f, iq4_nl %.3f\n", q4_1, q5_0, q5_1, iq4_nl);
  EXPECT_LT(q5_1, q4_1);
  EXPECT_LT(q5_1, 0.25);
  EXPECT_LT(q5_0, 0.3);
  EXPECT_LT(iq4_nl, 1.2 * q4_1);  // 4.5 bits per weight as Q4_0, fewer than Q4_1's 5
}

TEST(Quantize, RejectsUnsupportedTargets) {
  TempFile src(".gguf"), dst(".gguf");
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-llama");
  EXPECT_THROW(quantize_model(src.path(), dst.path(), DType::Q8_1), Error);
  EXPECT_THROW(parse_quantize_recipe("q3_k_m"), Error);
  EXPECT_THROW(quantize_model("/nonexistent.gguf", dst.path(), DType::Q8_0), Error);
}

// The searched K-quant scales never do worse than the range rule, and do
// better on rows with outliers (real weights have them).
TEST(Quantize, SearchedKQuantScalesLowerTheError) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 256 * 6;
  std::vector<float> row(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  for (size_t i = 0; i < row.size(); ++i) row[i] = normal(rng) * (i % 97 == 0 ? 8.0f : 1.0f) + (i % 5 == 0 ? 0.3f : 0.0f);
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    std::vector<uint8_t> plain(dtype_row_bytes(type, n)), searched(plain.size());
    quantize_row(type, row.data(), plain.data(), n);
    quantize_row_searched(type, row.data(), searched.data(), n);
    auto error_of = [&](const std::vector<uint8_t>& q) {
      dequantize_row(type, q.data(), back.data(), n);
      double e = 0;
      for (size_t i = 0; i < row.size(); ++i) e += (back[i] - row[i]) * (back[i] - row[i]);
      return e;
    };
    const double before = error_of(plain), after = error_of(searched);
    EXPECT_LT(after, before) << dtype_name(type);
    if (type == DType::Q4_K) {
      EXPECT_LT(after, 0.9 * before);
    }
    std::printf("%s: squared error %.4f with range scales, %.4f searched\n", dtype_name(type), before, after);
  }
}

// q4_k_m as llama.cpp mixes it: Q6_K for the (tied) embeddings and for
// attn_v / ffn_down of the layers that get more bits, Q4_K elsewhere, and
// rows that are not whole 256-value blocks fall back to Q5_0.
TEST(Quantize, Q4KMMixesTypesAsLlamaCppDoes) {
  TempFile src(".gguf"), mixed(".gguf"), narrow(".gguf");
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-qwen2-256", DType::F32);
  quantize_model(src.path(), mixed.path(), parse_quantize_recipe("q4_k_m"));
  GGUFFile m(mixed.path());
  EXPECT_EQ(m.get_uint("general.file_type"), 15u);
  const auto type_of = [&m](const std::string& name) { return tensor_type(m, name); };
  EXPECT_EQ(type_of("token_embd.weight"), DType::Q6_K);  // tied: it is the output head too
  EXPECT_EQ(type_of("blk.0.attn_v.weight"), DType::Q4_K);
  EXPECT_EQ(type_of("blk.1.attn_v.weight"), DType::Q6_K);  // the last eighth
  EXPECT_EQ(type_of("blk.1.ffn_down.weight"), DType::Q6_K);
  EXPECT_EQ(type_of("blk.0.ffn_gate.weight"), DType::Q4_K);
  EXPECT_EQ(type_of("blk.0.attn_norm.weight"), DType::F32);
  // The mixed model computes what the f32 one does, within 4-bit error.
  EXPECT_LT(logits_error(src.path(), mixed.path()), 0.25);  // random weights: 0.16 measured

  // tiny-qwen2 has 64-wide rows: every K-quant matrix falls back.
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-qwen2", DType::F32);
  quantize_model(src.path(), narrow.path(), parse_quantize_recipe("q6_k"));
  const GGUFFile n(narrow.path());
  for (const TensorView& t : n.tensors()) {
    if (t.n_dims == 2) {
      EXPECT_EQ(t.type, DType::Q8_0) << t.name;
    }
  }
}

// A mixture of experts under q4_k_m: the stacked expert tensors are quantized
// like matrices (their 64-wide rows fall back from Q4_K to Q5_0, and the down
// experts of the layers with more bits from Q6_K to Q8_0), the router stays
// f32 as llama.cpp keeps it, and the model computes what the f32 one does.
TEST(Quantize, Q4KMQuantizesStackedExpertsAndKeepsTheRouter) {
  TempFile src(".gguf"), mixed(".gguf");
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-qwen3moe", DType::F32);
  const QuantizeReport report = quantize_model(src.path(), mixed.path(), parse_quantize_recipe("q4_k_m"));
  EXPECT_EQ(report.kept, (std::vector<std::string>{"blk.0.ffn_gate_inp.weight", "blk.1.ffn_gate_inp.weight"}));
  const GGUFFile m(mixed.path());
  const auto type_of = [&m](const std::string& name) { return tensor_type(m, name); };
  EXPECT_EQ(type_of("blk.0.ffn_gate_exps.weight"), DType::Q5_0);
  EXPECT_EQ(type_of("blk.0.ffn_down_exps.weight"), DType::Q5_0);
  EXPECT_EQ(type_of("blk.1.ffn_down_exps.weight"), DType::Q8_0);
  EXPECT_EQ(type_of("blk.1.ffn_gate_inp.weight"), DType::F32);
  EXPECT_LT(logits_error(src.path(), mixed.path()), 0.25);
}
