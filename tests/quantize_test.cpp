// `kvserve quantize`: metadata survives, matrices change type, and a q8_0
// copy of a real model generates the same greedy text.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "engine/decoder.h"
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

TEST(Quantize, RejectsUnsupportedTargets) {
  TempFile src(".gguf"), dst(".gguf");
  ::kvserve::test_util::write_synth_model(src.path(), "tiny-llama");
  EXPECT_THROW(quantize_model(src.path(), dst.path(), DType::Q6_K), Error);
  EXPECT_THROW(quantize_model("/nonexistent.gguf", dst.path(), DType::Q8_0), Error);
}
