// kvserve against llama.cpp on the same synthesized files (issue #18):
// tests/data/llama_cpp_oracle.json holds llama.cpp's greedy tokens and top-5
// log probabilities for fixed prompts, made by
// tools/reference/llama_cpp_oracle.py (the command is in the file). The files
// are re-synthesized here (byte-identical for a preset, type and seed), so CI
// checks the agreement without llama.cpp: among them tiny-llama3, whose RoPE
// carries Llama 3's per-frequency factors (rope_freqs.weight), and the
// mixtures of experts tiny-qwen3moe and tiny-qwen2moe (issue #35).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "decode/decoder.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "test_util.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

std::vector<double> log_softmax(std::span<const float> logits) {
  double max = -INFINITY, sum = 0;
  for (float v : logits) max = std::max(max, static_cast<double>(v));
  for (float v : logits) sum += std::exp(v - max);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - max - std::log(sum);
  return out;
}

json load_oracle() {
  std::ifstream f(std::string(KVSERVE_SOURCE_DIR) + "/tests/data/llama_cpp_oracle.json");
  return json::parse(f);
}

class LlamaCppOracle : public ::testing::TestWithParam<int> {};

}  // namespace

// Teacher-forced on llama.cpp's tokens: at every step kvserve's top-5 log
// probabilities match llama.cpp's and its greedy pick is the same, except
// where llama.cpp itself had a near-tie. f32 weights are computed exactly on
// both sides; quantized ones with 8-bit activations on both (llama.cpp's
// q8_0 / q8_K, kvserve's default), which round differently, hence the wider
// tolerance.
TEST_P(LlamaCppOracle, GreedyTokensAndTopLogprobsAgree) {
  const json oracle = load_oracle();
  const json& c = oracle["cases"][static_cast<size_t>(GetParam())];
  const std::string name = c["preset"].get<std::string>() + " " + c["type"].get<std::string>();
  const DType type = parse_dtype(c["type"].get<std::string>());
  test_util::TempFile file(".gguf");
  test_util::write_synth_model(file.path(), c["preset"], type, c["seed"].get<uint64_t>());
  auto model = Model::load(file.path());
  const bool exact = type == DType::F32;
  // measured: <= 7e-6 (f32), <= 0.066 (q8_0 weights), iq4_nl 0.065, iq4_xs 0.084, q2_k 0.026. llama.cpp's GELU
  // (gemma3) reads a table indexed by the fp16-rounded input: 1.3e-3 here,
  // 3.5e-4 once kvserve was made to round the same way (so the table is most of it).
  const bool gelu = model->config().ffn_activation == ModelConfig::FfnActivation::kGeluTanh;
  // q3_k: 0.12 (seeds 2 and 3: 0.095, 0.099), and kvserve with exact f32 activations is itself 0.10 from
  // llama.cpp's (q8_K-activation) record on that file: the spread is llama.cpp's
  // own activation rounding, which that file's logits amplify, not a decoding
  // difference (its blocks decode bit for bit as ggml's dequantize_row_q3_K).
  // tiny-deepseek / tiny-deepseek2 q8_0 (MLA): 0.123, 0.116 since kvserve refines each half of a 32-value
  // block's activations by a power of two (docs/performance.md, "Half refinements"), where llama.cpp's q8_0
  // keeps one scale; with exact activations kvserve is itself 0.070 and 0.121 from llama.cpp's record, and
  // with llama.cpp's rounding it was 0.058 and 0.095: the two engines now round differently, and these
  // files' logits amplify it.
  const bool mla = c["preset"].get<std::string>().starts_with("tiny-deepseek");
  const double tolerance = exact ? (gelu ? 3e-3 : 1e-4) : type == DType::Q3_K || mla ? 0.15 : 0.1;

  auto d = make_decoder("cached", *model, model->config().context_length);
  const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = c["generated_ids"].get<std::vector<int32_t>>();
  // The generation banned ids [banned[0], banned[1]) (byte tokens that end
  // inside a UTF-8 character, for which llama-server reports no
  // probabilities); the reported log probabilities are of the unbiased logits.
  const int32_t banned_lo = c["banned_ids"][0], banned_hi = c["banned_ids"][1];
  std::vector<float> allowed;
  std::span<const float> logits = d->append(prompt);
  double worst = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    const json& top = c["top_logprobs"][s];
    const std::vector<double> lp = log_softmax(logits);
    for (const json& entry : top) {
      const double diff = std::fabs(lp[entry[0].get<size_t>()] - entry[1].get<double>());
      worst = std::max(worst, diff);
      EXPECT_LT(diff, tolerance) << name << " step " << s << " id " << entry[0];
    }
    allowed.assign(logits.begin(), logits.end());
    std::fill(allowed.begin() + banned_lo, allowed.begin() + banned_hi, -INFINITY);
    std::vector<float> sorted = allowed;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] > 2 * tolerance) {  // not a near-tie
      EXPECT_EQ(argmax(allowed), want[s]) << name << " step " << s;
    }
    logits = d->append(std::span<const int32_t>(&want[s], 1));
  }
  std::printf("%s: %zu steps, largest top-5 log-probability difference %.2e\n", name.c_str(), want.size(), worst);
}

INSTANTIATE_TEST_SUITE_P(SynthFiles, LlamaCppOracle, ::testing::Range(0, static_cast<int>(load_oracle()["cases"].size())));
