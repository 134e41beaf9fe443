// End-to-end checks on real pretrained models against an independent
// implementation: tools/reference/llama_reference.py, a float64 numpy forward
// pass written separately from this engine (see tools/reference/README.md),
// whose outputs are recorded in tests/data/*_reference.json.
//  - SmolLM2-135M-Instruct Q4_1 (the default model, fetched by scripts/setup.sh)
//  - stories260K (llama2.c checkpoint in ../shared/models), converted here.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "decode/decoder.h"
#include "kernels/dispatch.h"
#include "model/llama2c.h"
#include "sampling/sampler.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace kvserve;
using nlohmann::json;

namespace {

// The references are float64 implementations: compare against exact f32 activations.
const ModelLoadOptions kExact{.activations = ActivationPrecision::kF32};


json load_reference(const std::string& name) {
  std::ifstream f(std::string(KVSERVE_SOURCE_DIR) + "/tests/data/" + name);
  return json::parse(f);
}

// Greedy-decodes the case's generated ids with `decoder`. The reference is
// float64 with exactly dequantized weights; this engine computes in f32 (and
// may quantize activations to 8 bits in its integer kernels), so a step
// whose top-2 margin in the reference is tiny may legitimately flip. Until
// such a step the ids must match exactly; the first mismatch is only
// accepted at a near-tie (margin < 0.25) after at least half the tokens.
// Returns the steps that matched. With exact activations the first mismatch
// must also come after half the tokens; 8-bit activations move the logits by
// up to ~0.3, so there any step with a margin under kQ8NearTie may flip (seen:
// 0.29 on SmolLM2's fibonacci case with the AVX2 table and the vector SiLU;
// other ISAs and the scalar SiLU flip other steps, all near-ties).
constexpr double kQ8NearTie = 0.35;
size_t expect_greedy_matches(Decoder& decoder, const json& c, bool exact = true) {
  const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = c["generated_ids"].get<std::vector<int32_t>>();
  std::span<const float> logits = decoder.append(prompt);
  for (size_t s = 0; s < want.size(); ++s) {
    const int32_t got = argmax(logits);
    if (got != want[s]) {
      const double margin = c["steps"][s]["margin"].get<double>();
      EXPECT_LT(margin, exact ? 0.25 : kQ8NearTie) << c["name"] << ": step " << s << " got " << got << ", want " << want[s];
      if (exact) {
        EXPECT_GE(s, want.size() / 2) << c["name"] << ": diverged early at a near-tie, step " << s;
      }
      return s;
    }
    if (s + 1 < want.size()) logits = decoder.append(std::span<const int32_t>(&want[s], 1));
  }
  return want.size();
}

class SmolLM2 : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = kvserve::test_util::default_model_path();
    if (path_.empty()) GTEST_SKIP() << "default model not fetched (run scripts/fetch_models.sh)";
    model_ = Model::load(path_, kExact);
    reference_ = load_reference("smollm2_reference.json");
  }
  std::string path_;
  std::unique_ptr<Model> model_;
  json reference_;
};

}  // namespace

TEST_F(SmolLM2, RealModelTokenizerMatchesReferenceIds) {
  const Tokenizer tok = Tokenizer::from_gguf(model_->file());
  for (const json& c : reference_["cases"]) {
    const auto want = c["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(c["prompt"].get<std::string>(), tok.add_bos()), want) << c["name"];
    // Control tokens (<|im_start|>...) decode to nothing, as in generated text.
    if (c["prompt"].get<std::string>().find("<|") == std::string::npos) {
      EXPECT_EQ(tok.decode(want), c["prompt"].get<std::string>()) << c["name"];
    }
  }
}

TEST_F(SmolLM2, RealModelGreedyMatchesReference) {
  for (const json& c : reference_["cases"]) {
    auto d = make_decoder("cached", *model_, 128);
    expect_greedy_matches(*d, c);
  }
}

// The default (8-bit activation) mode against the same float64 reference:
// the same near-tie rule; the agreement is printed (docs/performance.md).
TEST_F(SmolLM2, RealModelDefaultActivationsGreedyMatchesReference) {
  auto model = Model::load(path_);
  for (const json& c : reference_["cases"]) {
    auto d = make_decoder("cached", *model, 128);
    const size_t matched = expect_greedy_matches(*d, c, false);
    std::printf("%s: %zu of %zu greedy tokens as the float64 reference\n", c["name"].get<std::string>().c_str(),
                matched, c["generated_ids"].size());
  }
}

TEST_F(SmolLM2, RealModelFirstLogitsMatchReference) {
  for (const json& c : reference_["cases"]) {
    auto d = make_decoder("cached", *model_, 128);
    std::span<const float> logits = d->append(c["prompt_ids"].get<std::vector<int32_t>>());
    for (const auto& [id, value] : c["first_step_fixed_logits"].items()) {
      // 8-bit activations in the integer kernels move logits by ~1e-2.
      EXPECT_NEAR(logits[static_cast<size_t>(std::stoi(id))], value.get<double>(), 0.1) << c["name"] << " id " << id;
    }
  }
}

TEST_F(SmolLM2, RealModelNaiveAndCachedAgree) {
  const auto& c = reference_["cases"][0];
  auto naive = make_decoder("naive", *model_, 64);
  auto cached = make_decoder("cached", *model_, 64);
  const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
  std::span<const float> a = naive->append(prompt), b = cached->append(prompt);
  for (int s = 0; s < 6; ++s) {
    double diff = 0, mag = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      mag = std::max(mag, static_cast<double>(std::fabs(a[i])));
    }
    EXPECT_LT(diff / mag, 1e-4) << "step " << s;
    const int32_t t = argmax(a);
    ASSERT_EQ(t, argmax(b)) << "step " << s;
    a = naive->append(std::span<const int32_t>(&t, 1));
    b = cached->append(std::span<const int32_t>(&t, 1));
  }
}

TEST(Stories260K, RealModelConvertedMatchesLlama2cReference) {
  const std::string dir = kvserve::test_util::shared_models_dir();
  if (!std::filesystem::exists(dir + "/stories260K.bin")) GTEST_SKIP() << "no " << dir << "/stories260K.bin";
  kvserve::test_util::TempFile out(".gguf");
  Llama2cOptions o;
  o.checkpoint_path = dir + "/stories260K.bin";
  o.tokenizer_path = dir + "/tok512.bin";
  o.output_path = out.path();
  convert_llama2c(o);
  auto model = Model::load(out.path(), kExact);
  const json ref = load_reference("stories260k_reference.json");

  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  EXPECT_EQ(tok.encode(ref["prompt"].get<std::string>(), true), ref["prompt_ids"].get<std::vector<int32_t>>());

  // f32 weights: the first logits agree with the float64 reference closely.
  auto d = make_decoder("cached", *model, 256);
  std::span<const float> logits = d->append(ref["prompt_ids"].get<std::vector<int32_t>>());
  const auto want = ref["first_step_logits"].get<std::vector<double>>();
  ASSERT_EQ(logits.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(logits[i], want[i], 1e-4 * 20) << "id " << i;

  for (const char* kind : {"naive", "cached"}) {
    auto dec = make_decoder(kind, *model, 256);
    json c = ref;
    c["name"] = std::string("stories260K/") + kind;
    expect_greedy_matches(*dec, c);
  }
}

// Qwen2.5-Coder Instruct 0.5B (Q5_0 / Q8_0 / Q4_K / Q6_K) and 1.5B (Q4_K /
// Q6_K), assembled by `scripts/fetch_models.sh --qwen-coder` (opt-in; these
// tests skip without the files). The 0.5B greedy ids are checked against the
// float64 reference in tests/data/qwen25_coder_05b_reference.json.
namespace {

std::unique_ptr<Model> load_qwen_coder(const std::string& size) {
  const std::string path = kvserve::test_util::model_dir() + "/qwen2.5-coder-" + size + "-instruct.gguf";
  return std::filesystem::exists(path) ? Model::load(path, kExact) : nullptr;
}

}  // namespace

TEST(QwenCoder, RealModelQwen2SpecificsAreRead) {
  auto m = load_qwen_coder("0.5b");
  if (!m) GTEST_SKIP() << "Qwen2.5-Coder 0.5B not fetched (scripts/fetch_models.sh --qwen-coder)";
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.rope_neox);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_FALSE(m->weights().layers[0].bq.empty());
  EXPECT_FALSE(m->weights().layers[0].bk.empty());
  EXPECT_FALSE(m->weights().layers[0].bv.empty());
  EXPECT_FALSE(m->weights().tied_output);
  // the mix llama.cpp chose: 896-wide rows cannot hold 256-value super-blocks
  EXPECT_EQ(m->weights().token_embd.type, DType::Q5_0);
  EXPECT_EQ(m->weights().output.type, DType::Q8_0);
  EXPECT_EQ(m->weights().layers[0].w_down.type, DType::Q6_K);
  const Tokenizer tok = Tokenizer::from_gguf(m->file());
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.piece(151645), "<|im_end|>");
  EXPECT_TRUE(tok.is_end_of_generation(151645));
}

TEST(QwenCoder, RealModel05BGreedyMatchesReference) {
  auto m = load_qwen_coder("0.5b");
  if (!m) GTEST_SKIP() << "Qwen2.5-Coder 0.5B not fetched (scripts/fetch_models.sh --qwen-coder)";
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  const json reference = load_reference("qwen25_coder_05b_reference.json");
  const Tokenizer tok = Tokenizer::from_gguf(m->file());
  for (const json& c : reference["cases"]) {
    EXPECT_EQ(tok.encode(c["prompt"].get<std::string>(), tok.add_bos()), c["prompt_ids"].get<std::vector<int32_t>>())
        << c["name"];
    auto d = make_decoder("cached", *m, 256);
    expect_greedy_matches(*d, c);
    // f32 activations: within 0.05 (measured); q8 activations move these
    // logits (magnitude ~20) by up to ~0.2 and keep the same greedy ids.
    const double tolerance = activation_precision() == ActivationPrecision::kF32 ? 0.05 : 0.3;
    auto d2 = make_decoder("cached", *m, 256);
    std::span<const float> logits = d2->append(c["prompt_ids"].get<std::vector<int32_t>>());
    for (const json& top : c["first_step_top20"])
      EXPECT_NEAR(logits[top[0].get<size_t>()], top[1].get<double>(), tolerance) << c["name"] << " id " << top[0];
  }
}

TEST(QwenCoder, RealModel05BDefaultActivationsGreedyMatchesReference) {
  const std::string path = kvserve::test_util::model_dir() + "/qwen2.5-coder-0.5b-instruct.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "Qwen2.5-Coder 0.5B not fetched (scripts/fetch_models.sh --qwen-coder)";
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  auto m = Model::load(path);
  const json reference = load_reference("qwen25_coder_05b_reference.json");
  for (const json& c : reference["cases"]) {
    auto d = make_decoder("cached", *m, 256);
    const size_t matched = expect_greedy_matches(*d, c, false);
    std::printf("%s: %zu of %zu greedy tokens as the float64 reference\n", c["name"].get<std::string>().c_str(),
                matched, c["generated_ids"].size());
  }
}

TEST(QwenCoder, RealModel15BWritesCode) {
  auto m = load_qwen_coder("1.5b");
  if (!m) GTEST_SKIP() << "Qwen2.5-Coder 1.5B not fetched (scripts/fetch_models.sh --qwen-coder)";
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  EXPECT_EQ(m->weights().layers[0].wq.type, DType::Q4_K);
  const Tokenizer tok = Tokenizer::from_gguf(m->file());
  auto d = make_decoder("cached", *m, 128);
  std::vector<int32_t> ids = tok.encode("def fibonacci(n):", tok.add_bos()), out;
  std::span<const float> logits = d->append(ids);
  for (int s = 0; s < 16; ++s) {
    out.push_back(argmax(logits));
    logits = d->append(std::span<const int32_t>(&out.back(), 1));
  }
  const std::string text = tok.decode(out);
  EXPECT_NE(text.find("if n <= 0:"), std::string::npos) << text;
  EXPECT_NE(text.find("return"), std::string::npos) << text;
}
