// The small request fields clients send with every request: logit_bias,
// min_tokens, stop_token_ids, and the prefix-cache hits reported back
// (usage.prompt_tokens_details.cached_tokens), on a tiny random model.
#include <gtest/gtest.h>

#include <future>

#include "core/error.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "engine_run_util.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

namespace {

class RequestFields : public ::testing::Test {
 protected:
  void SetUp() override {
    test_util::write_synth_model(file_.path(), "tiny-llama");
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
    EngineOptions o;
    o.kv_blocks = 256;
    engine_ = std::make_unique<Engine>(*model_, *tokenizer_, o);
  }
  GenerationRequest request(int64_t max_tokens) const {
    GenerationRequest r;
    r.prompt = tokenizer_->encode("the cat sat on the mat and looked at the dog", false);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    return r;
  }
  engine_run::Output run(const GenerationRequest& r) { return engine_run::run_together(*engine_, {r})[0]; }
  TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace

TEST_F(RequestFields, LogitBiasForcesAndForbidsTokens) {
  GenerationRequest r = request(6);
  r.ignore_eos = true;
  const auto plain = run(r);
  ASSERT_EQ(plain.tokens.size(), 6u);
  const int32_t forced = (plain.tokens[0] + 7) % model_->config().vocab_size;
  r.logit_bias = {{forced, 100.0f}};
  for (int32_t t : run(r).tokens) EXPECT_EQ(t, forced);
  r.logit_bias = {{plain.tokens[0], -100.0f}};
  EXPECT_NE(run(r).tokens[0], plain.tokens[0]);
}

TEST_F(RequestFields, MinTokensHoldsBackTheEndOfGeneration) {
  GenerationRequest r = request(20);
  r.logit_bias = {{tokenizer_->eos_id(), 100.0f}};  // the model wants to stop at once
  auto out = run(r);
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(out.tokens.size(), 1u);
  r.min_tokens = 5;
  out = run(r);
  EXPECT_EQ(out.finish_reason, "stop");
  ASSERT_EQ(out.tokens.size(), 6u);  // five others, then the end
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(out.tokens[i], tokenizer_->eos_id());
  EXPECT_EQ(out.tokens[5], tokenizer_->eos_id());
}

TEST_F(RequestFields, StopTokenIdsEndTheBranchAfterMinTokens) {
  GenerationRequest r = request(20);
  r.ignore_eos = true;
  const int32_t stop = 42 % model_->config().vocab_size;
  r.logit_bias = {{stop, 100.0f}};
  r.stop_token_ids = {stop};
  auto out = run(r);
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(out.tokens, std::vector<int32_t>{stop});
  r.min_tokens = 3;
  out = run(r);
  EXPECT_EQ(out.finish_reason, "stop");
  ASSERT_EQ(out.tokens.size(), 4u);
  EXPECT_EQ(out.tokens.back(), stop);
}

TEST_F(RequestFields, MinTokensHoldsUnderNgramSpeculation) {
  GenerationRequest r = request(24);
  r.logit_bias = {{tokenizer_->eos_id(), 100.0f}};
  r.min_tokens = 9;
  GenerationRequest spec = r;
  spec.speculation.mode = SpeculativeMode::kNgram;
  spec.speculation.draft_k = 4;
  const auto outs = engine_run::run_together(*engine_, {r, spec});
  EXPECT_EQ(outs[0].tokens, outs[1].tokens);
  EXPECT_EQ(outs[1].tokens.size(), 10u);
}

TEST_F(RequestFields, CachedTokensCountThePromptFoundInThePrefixCache) {
  GenerationRequest r = request(2);
  r.prompt.clear();
  for (int i = 0; i < 70; ++i) r.prompt.push_back(3 + (i * 13) % 200);
  int64_t first = -1, second = -1;
  std::promise<void> a, b;
  engine_->submit(r, [&](const GenerationEvent& ev) { if (ev.finished) { first = ev.cached_tokens; a.set_value(); } });
  a.get_future().wait();
  engine_->submit(r, [&](const GenerationEvent& ev) { if (ev.finished) { second = ev.cached_tokens; b.set_value(); } });
  b.get_future().wait();
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 64);  // the four full 16-token blocks of the 70-token prompt
}

TEST_F(RequestFields, BadValuesAreRefusedAtSubmit) {
  GenerationRequest r = request(4);
  r.logit_bias = {{model_->config().vocab_size, 1.0f}};
  EXPECT_THROW(engine_->submit(r, [](const GenerationEvent&) {}), Error);
  r = request(4);
  r.stop_token_ids = {-1};
  EXPECT_THROW(engine_->submit(r, [](const GenerationEvent&) {}), Error);
  r = request(4);
  r.min_tokens = -2;
  EXPECT_THROW(engine_->submit(r, [](const GenerationEvent&) {}), Error);
}
