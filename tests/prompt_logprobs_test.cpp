// Prompt logprobs (GenerationRequest::prompt_logprobs, issue #33): each
// prompt token's logprob from the logits of the tokens before it, equal to
// the model's own full forward pass, whatever the chunking, with max_tokens 0,
// and never taken from positions the prefix cache skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <memory>
#include <vector>

#include "decode/decoder.h"
#include "engine/engine.h"
#include "engine/request_validation.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "engine_run_util.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;

namespace {

class PromptLogprobs : public ::testing::Test {
 protected:
  void SetUp() override {
    test_util::write_synth_model(file_.path(), "tiny-llama", DType::F32, 3);
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
  }

  std::vector<int32_t> prompt(int64_t len, int salt = 0) const {
    std::vector<int32_t> p;
    for (int64_t j = 0; j < len; ++j) p.push_back(static_cast<int32_t>((j * 37 + 11 + salt) % model_->config().vocab_size));
    return p;
  }

  // The full forward pass's log-softmax rows over the prompt, as the reference.
  std::vector<std::vector<float>> reference(const std::vector<int32_t>& p) const {
    auto decoder = make_decoder("naive", *model_, static_cast<int64_t>(p.size()) + 1);
    const std::span<const float> all = decoder->append_all(p);
    const auto vocab = static_cast<size_t>(model_->config().vocab_size);
    std::vector<std::vector<float>> rows(p.size());
    for (size_t i = 0; i < p.size(); ++i) Sampler::log_softmax(all.subspan(i * vocab, vocab), rows[i]);
    return rows;
  }

  // Every entry names prompt token i + 1 and equals the reference row i: its logprob, its rank, and the top k.
  void expect_matches_reference(const std::vector<int32_t>& p, const std::vector<TokenLogprob>& got, int32_t top) const {
    const auto ref = reference(p);
    ASSERT_EQ(got.size(), p.size() - 1);
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<float>& row = ref[i];
      EXPECT_EQ(got[i].id, p[i + 1]) << "position " << i + 1;
      EXPECT_NEAR(got[i].logprob, row[static_cast<size_t>(p[i + 1])], 1e-4) << "position " << i + 1;
      const auto above = std::count_if(row.begin(), row.end(), [&](float v) { return v > got[i].logprob; });
      EXPECT_NEAR(static_cast<double>(got[i].rank), static_cast<double>(above + 1), 1.0) << "position " << i + 1;
      ASSERT_EQ(got[i].top.size(), static_cast<size_t>(top));
      const float best = *std::max_element(row.begin(), row.end());
      if (top > 0) {
        EXPECT_NEAR(got[i].top[0].second, best, 1e-4) << "position " << i + 1;
      }
      for (size_t k = 1; k < got[i].top.size(); ++k) EXPECT_GE(got[i].top[k - 1].second, got[i].top[k].second);
    }
  }

  test_util::TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace

// Prompts prefilled in chunks of 8 beside other requests, with and without
// generated tokens after them: the same values as one full forward pass.
TEST_F(PromptLogprobs, EqualTheModelsOwnForwardPassWhateverTheChunks) {
  EngineOptions o;
  o.max_batch_tokens = 8;
  o.block_size = 4;
  Engine engine(*model_, *tokenizer_, o);
  std::vector<GenerationRequest> rs;
  for (int64_t len : {2, 7, 19, 30}) {
    GenerationRequest r = greedy_request(prompt(len, static_cast<int>(len)), len % 2 == 0 ? 0 : 3);
    r.prompt_logprobs = static_cast<int32_t>(len % 4);
    rs.push_back(r);
  }
  rs.push_back(greedy_request(prompt(12, 5), 4));  // one without prompt logprobs beside them
  const auto outs = run_together(engine, rs);
  for (size_t i = 0; i + 1 < rs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expect_matches_reference(rs[i].prompt, outs[i].prompt_logprobs, rs[i].prompt_logprobs);
    EXPECT_EQ(outs[i].finish_reason, "length");
    EXPECT_EQ(static_cast<int64_t>(outs[i].tokens.size()), rs[i].max_tokens);
  }
  EXPECT_TRUE(outs.back().prompt_logprobs.empty());
  // The generated tokens are those of the same request without prompt logprobs.
  GenerationRequest plain = rs[1];
  plain.prompt_logprobs = -1;
  EXPECT_EQ(run_alone(*model_, *tokenizer_, {plain})[0].tokens, outs[1].tokens);
}

// A prompt whose blocks are in the prefix cache is computed again for its
// logprobs (cached_tokens 0); the request after it, without, takes the hit.
TEST_F(PromptLogprobs, PrefixCacheHitsNeverCoverUnscoredPositions) {
  EngineOptions o;
  o.block_size = 4;
  Engine engine(*model_, *tokenizer_, o);
  const std::vector<int32_t> p = prompt(26);
  const auto warm = run_together(engine, {greedy_request(p, 2)});
  GenerationRequest scored = greedy_request(p, 2);
  scored.prompt_logprobs = 1;
  const auto out = run_together(engine, {scored})[0];
  EXPECT_EQ(out.cached_tokens, 0);
  expect_matches_reference(p, out.prompt_logprobs, 1);
  EXPECT_EQ(out.tokens, warm[0].tokens);
  EXPECT_GT(run_together(engine, {greedy_request(p, 2)})[0].cached_tokens, 0);
}

// n = 3 sequences share one prefill: each first event carries the prompt's logprobs.
TEST_F(PromptLogprobs, EverySequenceOfARequestGetsThem) {
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  GenerationRequest r = greedy_request(prompt(9), 0);
  r.prompt_logprobs = 2;
  r.n = 3;
  std::vector<std::vector<TokenLogprob>> got(3);
  std::promise<void> done;
  int finished = 0;
  engine.submit(r, [&](const GenerationEvent& ev) {
    if (!ev.prompt_logprobs.empty()) got[static_cast<size_t>(ev.index)] = ev.prompt_logprobs;
    if (ev.finished && ++finished == 3) done.set_value();
  });
  done.get_future().wait();
  for (const auto& g : got) expect_matches_reference(r.prompt, g, 2);
}

TEST_F(PromptLogprobs, MoreThanTwentyAlternativesAreRefused) {
  GenerationRequest r = greedy_request(prompt(4), 1);
  r.prompt_logprobs = kMaxPromptLogprobs + 1;
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  EXPECT_THROW(ValidatedRequest(r, engine.request_limits()), RequestError);
}

// Sequences preempted in a small pool and computed again: each prompt
// position is scored once, with the values of a full forward pass.
TEST_F(PromptLogprobs, PreemptedSequencesScoreEachPositionOnce) {
  EngineOptions o;
  o.block_size = 4;
  o.kv_blocks = 20;  // 80 tokens: three 30-token prompts growing by 12 cannot all stay
  o.max_batch_tokens = 16;
  o.max_running = 3;
  Engine engine(*model_, *tokenizer_, o);
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 3; ++i) {
    rs.push_back(greedy_request(prompt(30, 7 * i), 12));
    rs.back().prompt_logprobs = 1;
  }
  const auto outs = run_together(engine, rs);
  EXPECT_GT(engine.metrics().preemptions, 0);
  for (size_t i = 0; i < rs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expect_matches_reference(rs[i].prompt, outs[i].prompt_logprobs, 1);
    EXPECT_EQ(outs[i].tokens.size(), 12u);
  }
}
