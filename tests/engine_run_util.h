#pragma once
// Running requests through an Engine in tests: all at once or one at a time,
// collecting every event, and waiting for the engine to go idle.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace kvserve::engine_run {

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // GenerationRequest::prompt_logprobs
  std::string finish_reason;
  int64_t cached_tokens = 0;
};

// Submits every request at once and waits for all final events.
inline std::vector<Output> run_together(Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::vector<Output> outs(requests.size());
  std::vector<std::promise<void>> done(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine.submit(requests[i], [&outs, &done, i](const GenerationEvent& ev) {
      outs[i].tokens.insert(outs[i].tokens.end(), ev.tokens.begin(), ev.tokens.end());
      outs[i].text += ev.text;
      outs[i].logprobs.insert(outs[i].logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      if (!ev.prompt_logprobs.empty()) outs[i].prompt_logprobs = ev.prompt_logprobs;
      if (ev.finished) {
        outs[i].cached_tokens = ev.cached_tokens;
        outs[i].finish_reason = ev.finish_reason;
        done[i].set_value();
      }
    });
    EXPECT_TRUE(id.has_value()) << "request " << i << " refused";
    if (!id.has_value()) done[i].set_value();  // refused: nothing will finish it, so do not wait
  }
  for (auto& d : done) d.get_future().wait();
  return outs;
}

// Each request alone in one engine, one after the other (no prefix caching);
// threads: the engine's OpenMP threads (0: the default).
inline std::vector<Output> run_alone(const Model& model, const Tokenizer& tok,
                                     const std::vector<GenerationRequest>& requests, int threads = 0,
                                     KVType kv_type = KVType::F32) {
  EngineOptions o;
  o.threads = threads;
  o.kv_type = kv_type;
  o.prefix_caching = false;
  o.kv_blocks = 256;
  Engine engine(model, tok, o);
  std::vector<Output> outs;
  for (const GenerationRequest& r : requests) outs.push_back(run_together(engine, {r})[0]);
  return outs;
}

inline GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Prompts of varied lengths, some sharing a prefix.
inline std::vector<GenerationRequest> mixed_requests(int n, int64_t vocab, int64_t max_tokens) {
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    const int64_t len = 3 + (i * 11) % 37;
    for (int64_t j = 0; j < len; ++j) p.push_back(static_cast<int32_t>(((i % 3) * 17 + j * 29 + (j > 20 ? i : 0)) % vocab));
    rs.push_back(greedy_request(p, max_tokens - (i % 4) * 3));
  }
  return rs;
}

// A tiny random llama (3 layers, f32) written and loaded for each test.
class TinyModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test_util::write_synth_model(file_.path(), "tiny-llama", DType::F32, 3);
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
  }
  int64_t vocab() const { return model_->config().vocab_size; }
  test_util::TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

// Continuous batching with chunked prefill (steps of 24 tokens, prompts
// prefilled beside running decodes): every request gets exactly the tokens
// and log probabilities it gets alone.
inline void expect_batched_requests_get_what_they_get_alone(const Model& m, const std::vector<GenerationRequest>& rs,
                                                           const std::string& label) {
  const Tokenizer tok = Tokenizer::from_gguf(m.file());
  const auto alone = run_alone(m, tok, rs);
  EngineOptions o;
  o.max_running = static_cast<int64_t>(rs.size());
  o.kv_type = KVType::F32;  // as run_alone
  o.max_batch_tokens = 24;
  Engine engine(m, tok, o);
  const auto together = run_together(engine, rs);
  test_util::wait_idle(engine);
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << label << " request " << i;
    ASSERT_EQ(together[i].logprobs.size(), alone[i].logprobs.size());
    for (size_t t = 0; t < alone[i].logprobs.size(); ++t)
      EXPECT_EQ(together[i].logprobs[t].logprob, alone[i].logprobs[t].logprob) << label << " request " << i;
  }
}

// The engine's features over one model file: shared prefixes (prefix cache,
// copy-on-write), a pool too small for every sequence (preemption and
// recompute), and speculative decoding with n-gram drafts and with a draft
// model made of the file's first block. Each request's greedy tokens must
// equal what it gets alone.
inline void expect_engine_features_keep_greedy_tokens(const std::string& model_path) {
  auto m = Model::load(model_path);
  ModelLoadOptions draft_options;
  draft_options.max_layers = 1;
  auto draft = Model::load(model_path, draft_options);
  const Tokenizer tok = Tokenizer::from_gguf(m->file());
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 40; ++j) p.push_back(static_cast<int32_t>(j < 24 ? (j * 17 + 5) % 300 : (j * 13 + 11 * i) % 300));
    rs.push_back(greedy_request(p, 24));
  }
  const auto alone = run_alone(*m, tok, rs);
  for (const std::string variant : {"prefix+preemption", "ngram", "draft"}) {
    EngineOptions o;
    o.kv_type = KVType::F32;
    o.max_running = 6;
    o.max_batch_tokens = 32;
    o.block_size = 4;
    o.draft_model = draft.get();
    if (variant == "prefix+preemption") o.kv_blocks = 40;  // 6 x 64 positions need 96 blocks
    std::vector<GenerationRequest> with = rs;
    for (GenerationRequest& r : with) {
      if (variant == "ngram") r.speculation = {SpeculativeMode::kNgram, 4, false};
      if (variant == "draft") r.speculation = {SpeculativeMode::kDraftModel, 3, false};
    }
    Engine engine(*m, tok, o);
    const auto together = run_together(engine, with);
    test_util::wait_idle(engine);
    for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << variant << " request " << i;
    if (variant == "prefix+preemption") {
      EXPECT_GT(engine.metrics().prefix_hit_tokens, 0);
      EXPECT_GT(engine.metrics().preemptions, 0);
    }
  }
}

}  // namespace kvserve::engine_run
