// The Engine on sliding-window models (tiny random Gemma 3: 6 layers, the
// first 5 sliding with a 48-key window, context 256) with the sliding layers'
// K/V in their own pool that frees blocks behind the window
// (EngineOptions::sliding_window_kv) gives the same greedy tokens and the same
// logprobs, bit for bit, as keeping every position: under continuous batching
// with chunked prefill, prefix-cache hits, n > 1 sequences, preemption in a
// small pool and speculative rollback; and the sliding pool holds a window per
// sequence, not the whole context. Also Gemma 3 270M on its 664-token
// reference prompt (skipped without the file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine_run_util.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;

namespace {

constexpr int64_t kGemmaWindow = 48;  // tiny-gemma3's

class SlidingWindowEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    test_util::write_synth_model(file_.path(), "tiny-gemma3", DType::F32, 7);
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
    ASSERT_EQ(model_->config().sliding_window, kGemmaWindow);
  }
  int32_t vocab() const { return model_->config().vocab_size; }

  // Prompts of 100 to 150 tokens (2 to 3 windows), the first `shared` tokens common to all.
  std::vector<GenerationRequest> long_requests(int n, int64_t shared, int64_t max_tokens) const {
    std::vector<GenerationRequest> rs;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> p;
      const int64_t len = 100 + (i * 37) % 51;
      for (int64_t j = 0; j < len; ++j)
        p.push_back(static_cast<int32_t>((j * 29 + 5 + (j < shared ? 0 : i * 13)) % vocab()));
      GenerationRequest r = greedy_request(p, max_tokens);
      r.top_logprobs = 2;
      rs.push_back(r);
    }
    return rs;
  }

  EngineOptions options(bool free_sliding) const {
    EngineOptions o;
    o.max_running = 4;
    o.max_batch_tokens = 40;  // prompts prefill in chunks beside running decodes
    o.block_size = 8;
    o.sliding_window_kv = free_sliding;
    return o;
  }

  // Tokens equal and every logprob the same float.
  static void expect_same(const std::vector<Output>& got, const std::vector<Output>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
      for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
        EXPECT_EQ(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob) << "request " << i << " token " << t;
        EXPECT_EQ(got[i].logprobs[t].top, want[i].logprobs[t].top) << "request " << i << " token " << t;
      }
    }
  }

  std::vector<Output> run(const EngineOptions& o, const std::vector<GenerationRequest>& rs, EngineMetrics* m = nullptr) {
    Engine engine(*model_, *tokenizer_, o);
    std::vector<Output> out = run_together(engine, rs);
    test_util::wait_idle(engine);
    if (m) *m = engine.metrics();
    return out;
  }

  test_util::TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace

TEST_F(SlidingWindowEngine, ContinuousBatchingGivesTheSameTokensAndLogprobs) {
  const auto requests = long_requests(4, 0, 16);
  EngineMetrics kept, freed;
  const auto want = run(options(false), requests, &kept);
  const auto got = run(options(true), requests, &freed);
  expect_same(got, want);
  EXPECT_EQ(kept.kv_sliding_blocks_total, 0);
  EXPECT_GT(freed.kv_sliding_blocks_total, 0);
  // 4 running sequences, each a window plus a 40-token chunk at most.
  EXPECT_LE(freed.kv_sliding_blocks_used_peak, 4 * sliding_blocks_per_sequence(kGemmaWindow, 40, 8));
  EXPECT_LT(freed.kv_bytes_used_peak, kept.kv_bytes_used_peak);
  EXPECT_EQ(freed.kv_sliding_blocks_used, 0);
}

TEST_F(SlidingWindowEngine, OneLongSequenceHoldsAWindowOfSlidingBlocks) {
  const auto request = long_requests(3, 0, 40)[2];  // 123 prompt tokens + 40
  EngineMetrics kept, freed;
  const auto want = run(options(false), {request}, &kept);
  const auto got = run(options(true), {request}, &freed);
  expect_same(got, want);
  const int64_t positions = static_cast<int64_t>(request.prompt.size()) + 39;  // the last token needs no slot
  EXPECT_EQ(freed.kv_blocks_used_peak, (positions + 7) / 8);  // the global layer keeps every block
  EXPECT_EQ(kept.kv_blocks_used_peak, (positions + 7) / 8);
  EXPECT_LE(freed.kv_sliding_blocks_used_peak, sliding_blocks_per_sequence(kGemmaWindow, 40, 8));
}

TEST_F(SlidingWindowEngine, PrefixHitsGiveTheSameTokensAndLogprobs) {
  const auto requests = long_requests(3, 90, 16);
  const auto want = run(options(false), requests);
  EngineOptions o = options(true);
  Engine engine(*model_, *tokenizer_, o);
  const auto cold = run_together(engine, requests);
  const auto warm = run_together(engine, requests);  // the whole prompts are cached now
  expect_same(cold, want);
  expect_same(warm, want);
  test_util::wait_idle(engine);
  EXPECT_GT(engine.metrics().prefix_hit_tokens, 3 * 90);
}

TEST_F(SlidingWindowEngine, ParallelBranchesGiveTheSameSamples) {
  auto requests = long_requests(2, 0, 20);
  for (GenerationRequest& r : requests) {
    r.n = 3;
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 11;
  }
  // Sequences arrive as separate outputs only through events: collect per (request, sequence).
  const auto sequences = [&](const EngineOptions& o) {
    Engine engine(*model_, *tokenizer_, o);
    std::vector<std::vector<int32_t>> out(6);
    std::vector<std::promise<void>> done(6);
    for (size_t i = 0; i < requests.size(); ++i)
      engine.submit(requests[i], [&, i](const GenerationEvent& ev) {
        auto& tokens = out[i * 3 + static_cast<size_t>(ev.index)];
        tokens.insert(tokens.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) done[i * 3 + static_cast<size_t>(ev.index)].set_value();
      });
    for (auto& d : done) d.get_future().wait();
    return out;
  };
  const auto want = sequences(options(false));
  const auto got = sequences(options(true));
  EXPECT_EQ(got, want);
  EXPECT_NE(want[0], want[1]);  // the sequences did sample apart
}

TEST_F(SlidingWindowEngine, PreemptionInASmallPoolGivesTheSameTokens) {
  const auto requests = long_requests(4, 0, 16);
  const auto want = run(options(false), requests);
  EngineOptions o = options(true);
  o.kv_blocks = 40;  // 320 slots for 4 running sequences of up to 165 tokens
  EngineMetrics m;
  const auto got = run(o, requests, &m);
  expect_same(got, want);
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(m.kv_blocks_used + m.kv_sliding_blocks_used, 0);
}

TEST_F(SlidingWindowEngine, SpeculativeRollbackGivesTheSameTokens) {
  auto requests = long_requests(3, 0, 32);
  for (GenerationRequest& r : requests) {
    for (int rep = 0; rep < 2; ++rep)  // a repeated stretch gives prompt lookup drafts to accept and reject
      r.prompt.insert(r.prompt.end(), r.prompt.begin(), r.prompt.begin() + 20);
    r.top_logprobs = -1;
  }
  const auto want = run(options(false), requests);
  for (GenerationRequest& r : requests) r.speculation = {SpeculativeMode::kNgram, 6, false};
  EngineMetrics m;
  const auto got = run(options(true), requests, &m);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  EXPECT_GT(m.spec_rounds, 0);
  EXPECT_GT(m.spec_draft_tokens, m.spec_accepted_tokens);  // some drafts were rolled back
}

// Gemma 3 270M on the reference's 664-token prompt: the engine with the
// sliding pool gives the float64 reference's greedy ids (f32 activations),
// the same top logprobs, bit for bit, as keeping every position, and its
// sliding layers hold at most a window plus a chunk of blocks while the
// global layers hold all 42.
TEST(SlidingWindowRealModel, Gemma3LongPromptSameAsKeepingEveryPosition) {
  const std::string path = test_util::model_dir() + "/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "Gemma 3 270M not fetched (scripts/fetch_models.sh --gemma3)";
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  const auto model = Model::load(path, {.activations = ActivationPrecision::kF32});
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  std::ifstream f(std::string(KVSERVE_SOURCE_DIR) + "/tests/data/gemma3_270m_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  const nlohmann::json* longest = nullptr;
  for (const auto& c : ref["cases"])
    if (!longest || c["prompt_ids"].size() > (*longest)["prompt_ids"].size()) longest = &c;
  ASSERT_GT((*longest)["prompt_ids"].size(), 512u);
  const auto want_ids = (*longest)["generated_ids"].get<std::vector<int32_t>>();
  GenerationRequest r = greedy_request((*longest)["prompt_ids"].get<std::vector<int32_t>>(),
                                       static_cast<int64_t>(want_ids.size()));
  r.top_logprobs = 3;
  std::vector<Output> outs;
  std::vector<EngineMetrics> metrics;
  for (bool free_sliding : {false, true}) {
    EngineOptions o;
    o.sliding_window_kv = free_sliding;
    o.max_context = 1024;
    o.max_batch_tokens = 128;  // prefill chunks of 128: the window passes blocks during the prompt already
    Engine engine(*model, tok, o);
    outs.push_back(run_together(engine, {r})[0]);
    test_util::wait_idle(engine);
    metrics.push_back(engine.metrics());
  }
  EXPECT_EQ(outs[1].tokens, want_ids);
  EXPECT_EQ(outs[1].tokens, outs[0].tokens);
  for (size_t t = 0; t < outs[0].logprobs.size(); ++t) EXPECT_EQ(outs[1].logprobs[t].top, outs[0].logprobs[t].top);
  EXPECT_LE(metrics[1].kv_sliding_blocks_used_peak, sliding_blocks_per_sequence(512, 128, 16));
  EXPECT_EQ(metrics[1].kv_blocks_used_peak, (671 + 15) / 16);  // the global layers keep every block
  EXPECT_LT(metrics[1].kv_bytes_used_peak, metrics[0].kv_bytes_used_peak);
}

// Without sliding layers (or with freeing off) the engine builds the one pool
// it always did: max_running full contexts (under the 1 GiB cap).
TEST_F(SlidingWindowEngine, ModelsWithoutSlidingLayersKeepTheirOnePool) {
  test_util::TempFile llama_file(".gguf");
  test_util::write_synth_model(llama_file.path(), "tiny-llama");
  const auto llama = Model::load(llama_file.path());
  const Tokenizer llama_tok = Tokenizer::from_gguf(llama->file());
  EngineOptions o;  // max_running 16, block size 16; both models have a 256-token context
  const EngineMetrics plain = Engine(*llama, llama_tok, o).metrics();
  EXPECT_EQ(plain.kv_blocks_total, 16 * 16);
  EXPECT_EQ(plain.kv_sliding_blocks_total, 0);
  o.sliding_window_kv = false;
  const EngineMetrics kept = Engine(*model_, *tokenizer_, o).metrics();
  EXPECT_EQ(kept.kv_blocks_total, 16 * 16);
  EXPECT_EQ(kept.kv_sliding_blocks_total, 0);
  o.sliding_window_kv = true;
  o.max_batch_tokens = 16;  // the sliding pool: 16 sequences x (ceil((48 + 16) / 16) + 1) blocks
  const EngineMetrics freed = Engine(*model_, *tokenizer_, o).metrics();
  EXPECT_EQ(freed.kv_blocks_total, 16 * 16);
  EXPECT_EQ(freed.kv_sliding_blocks_total, 16 * 5);
}
