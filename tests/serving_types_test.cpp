// Every architecture and every weight type through the engine `serve` runs
// (issue #18): continuous batching with chunked prefill, prefix caching and
// copy-on-write, over each KV cache type the head size allows. Concurrent
// greedy requests must give the tokens each gives alone; the single-sequence
// paths are checked against llama.cpp in llama_cpp_oracle_test.cpp.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/engine.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "engine_run_util.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;

namespace {

struct ServingCase {
  const char* preset;
  DType weights;
  KVType kv;
  // Half the cases run under the sanitizer (skip_slow): alternate weight and
  // KV types, so each type still goes through the engine there once or more.
  bool in_sanitizer_run;
};

std::string case_name(const ServingCase& c) {
  std::string name = std::string(c.preset) + "_" + dtype_name(c.weights) + "_kv_" + kv_type_info(c.kv).name;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

std::vector<ServingCase> serving_cases() {
  std::vector<ServingCase> cases;
  // Every weight type on rows of 256 and 512 (K-quant super-blocks fit), with an f32 and an 8-bit KV cache.
  int parity = 0;
  // Float weights are skipped there too: their unoptimized kernels made those cases the slowest (~20 s each),
  // and FloatPackedMatmul covers the kernels under the sanitizer.
  const auto add = [&](const char* preset, DType w, KVType kv) {
    const bool float_weights = w == DType::F32 || w == DType::F16 || w == DType::BF16;
    cases.push_back({preset, w, kv, parity++ % 2 == 0 && !float_weights});
  };
  for (DType w : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K}) {
    for (KVType kv : {KVType::F32, KVType::Q8_0}) add("tiny-qwen2-256", w, kv);
    ++parity;  // the next weight type starts with the other KV type
  }
  // Every architecture with every KV type its head size allows (q8_0, fp8, q4_0 store blocks of 32).
  for (const char* preset : {"tiny-qwen3", "tiny-gemma3"}) {
    for (KVType kv : {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0})
      add(preset, DType::Q8_0, kv);
    ++parity;
  }
  for (const char* preset : {"tiny-llama3", "tiny-phi3"})
    for (KVType kv : {KVType::F32, KVType::F16, KVType::BF16}) add(preset, DType::Q8_0, kv);
  // Mixtures of experts (issue #35): a step's rows grouped by expert must not change any request's tokens.
  // (tiny-qwen2moe's heads of 16 take no 32-blocks.)
  for (KVType kv : {KVType::F16, KVType::Q8_0}) add("tiny-qwen3moe", DType::Q8_0, kv);
  for (KVType kv : {KVType::F16, KVType::BF16}) add("tiny-qwen2moe", DType::Q4_0, kv);
  add("tiny-deepseek", DType::Q8_0, KVType::F16);
  // YaRN RoPE scaling (its blended frequencies and magnitude apply at every position) through the paged path.
  add("tiny-qwen3-yarn", DType::Q8_0, KVType::F16);
  // MLA (deepseek2): the latent rows (96 values) in every KV type; V-3's router on a low-rank query.
  for (KVType kv : {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0})
    add("tiny-deepseek2", DType::Q8_0, kv);
  add("tiny-deepseek3", DType::Q4_0, KVType::F16);
  add("tiny-deepseek2-yarn", DType::Q8_0, KVType::BF16);
  return cases;
}

class ServingTypes : public ::testing::TestWithParam<ServingCase> {};

}  // namespace

TEST_P(ServingTypes, ConcurrentGreedyWithPrefixCachingEqualsAlone) {
  const ServingCase& c = GetParam();
  if (test_util::skip_slow() && !c.in_sanitizer_run)
    GTEST_SKIP() << "the sanitizer run takes every other case (types alternate); all ran in the Release suite";
  test_util::TempFile file(".gguf");
  test_util::write_synth_model(file.path(), c.preset, c.weights, 5);
  auto model = Model::load(file.path());
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  // Up to 40 prompt tokens + 20 generated: past tiny-gemma3's 48-key window, so its sliding layers free blocks.
  // The sanitizer run (skip_slow) generates fewer tokens; the Release run goes past the window.
  const auto requests = mixed_requests(8, model->config().vocab_size, test_util::skip_slow() ? 12 : 20);
  const auto alone = run_alone(*model, tok, requests, 0, c.kv);
  EngineOptions o;
  o.kv_type = c.kv;
  o.max_running = 5;
  o.max_batch_tokens = 20;  // prompts are prefilled in chunks next to running decodes
  o.block_size = 4;
  Engine engine(*model, tok, o);
  const auto together = run_together(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
  EXPECT_GT(engine.metrics().prefix_hit_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(EveryType, ServingTypes, ::testing::ValuesIn(serving_cases()),
                         [](const ::testing::TestParamInfo<ServingCase>& info) { return case_name(info.param); });
