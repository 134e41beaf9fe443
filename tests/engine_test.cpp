// The Engine boundary on a tiny synthesized model: streaming events, stop
// conditions, cancellation, queue limits and input validation.
#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>

#include "core/error.h"
#include "decode/decoder.h"
#include "engine/engine.h"
#include "engine/request_validation.h"
#include "engine/stop_strings.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

namespace {

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  GenerationEvent last;
};

// Submits and waits for the final event.
Collected run_request(Engine& engine, GenerationRequest r) {
  auto done = std::make_shared<std::promise<Collected>>();
  auto acc = std::make_shared<Collected>();
  auto id = engine.submit(std::move(r), [done, acc](const GenerationEvent& ev) {
    acc->tokens.insert(acc->tokens.end(), ev.tokens.begin(), ev.tokens.end());
    acc->text += ev.text;
    if (ev.finished) {
      acc->last = ev;
      done->set_value(*acc);
    }
  });
  EXPECT_TRUE(id.has_value());
  return done->get_future().get();
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::kvserve::test_util::write_synth_model(file_.path(), "tiny-llama");
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
  }
  GenerationRequest greedy(int64_t max_tokens) const {
    GenerationRequest r;
    r.prompt = tokenizer_->encode("the cat sat on the mat", false);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }
  TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace

TEST(StopStrings, HoldsBackPrefixesAndCutsAtTheStop) {
  StopStringMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("hello E"), "hello ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("x"), "ENx");
  EXPECT_EQ(m.push(" done\n"), " done");
  EXPECT_EQ(m.push("\nmore"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("later"), "");
  StopStringMatcher n({"stop"});
  EXPECT_EQ(n.push("a sto"), "a ");
  EXPECT_EQ(n.flush(), "sto");
}

TEST_F(EngineTest, GreedyOutputEqualsTheDecoder) {
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  const GenerationRequest r = greedy(12);
  const Collected got = run_request(engine, r);
  auto d = make_decoder("cached", *model_, 256);
  std::span<const float> logits = d->append(r.prompt);
  std::vector<int32_t> want;
  for (int i = 0; i < 12; ++i) {
    want.push_back(argmax(logits));
    logits = d->append(std::span<const int32_t>(&want.back(), 1));
  }
  EXPECT_EQ(got.tokens, want);
  TokenTextStream stream(*tokenizer_);
  std::string want_text;
  for (int32_t id : want) want_text += stream.push(id);
  EXPECT_EQ(got.text, want_text + stream.flush());
  EXPECT_EQ(got.last.finish_reason, "length");
  EXPECT_EQ(got.last.completion_tokens, 12);
  EXPECT_EQ(engine.metrics().requests_finished, 1);
}

TEST_F(EngineTest, StopStringEndsGeneration) {
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  const Collected full = run_request(engine, greedy(16));
  ASSERT_GE(full.text.size(), 4u);
  GenerationRequest r = greedy(16);
  const std::string stop = full.text.substr(2, 2);
  r.stop = {stop};
  const Collected cut = run_request(engine, r);
  EXPECT_EQ(cut.last.finish_reason, "stop");
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
}

TEST_F(EngineTest, LogprobsAreReported) {
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  GenerationRequest r = greedy(3);
  r.top_logprobs = 2;
  auto lps = std::make_shared<std::vector<TokenLogprob>>();
  std::promise<void> done;
  engine.submit(r, [&, lps](const GenerationEvent& ev) {
    lps->insert(lps->end(), ev.logprobs.begin(), ev.logprobs.end());
    if (ev.finished) done.set_value();
  });
  done.get_future().wait();
  ASSERT_EQ(lps->size(), 3u);
  for (const TokenLogprob& lp : *lps) {
    ASSERT_EQ(lp.top.size(), 2u);
    EXPECT_EQ(lp.top[0].first, lp.id);  // greedy picks the most likely
    EXPECT_LE(lp.logprob, 0.0f);
  }
}

TEST_F(EngineTest, CancelStopsARequest) {
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  std::promise<GenerationEvent> done;
  std::atomic<int> events{0};
  Engine* e = &engine;
  std::optional<RequestId> id;
  std::mutex m;
  id = engine.submit(greedy(200), [&](const GenerationEvent& ev) {
    if (++events == 3) {
      std::lock_guard lock(m);
      e->cancel(ev.id);
    }
    if (ev.finished) done.set_value(ev);
  });
  const GenerationEvent last = done.get_future().get();
  EXPECT_EQ(last.finish_reason, "cancelled");
  EXPECT_LT(last.completion_tokens, 200);
}

TEST_F(EngineTest, RejectsBadRequests) {
  EngineOptions o;
  o.max_context = 32;
  Engine engine(*model_, *tokenizer_, o);
  GenerationRequest empty = greedy(4);
  empty.prompt.clear();
  EXPECT_THROW(engine.submit(empty, [](const GenerationEvent&) {}), Error);
  GenerationRequest too_long = greedy(4);
  too_long.prompt.assign(40, 5);
  EXPECT_THROW(engine.submit(too_long, [](const GenerationEvent&) {}), Error);
  GenerationRequest bad_sampling = greedy(4);
  bad_sampling.sampling.top_p = 2;
  EXPECT_THROW(engine.submit(bad_sampling, [](const GenerationEvent&) {}), Error);
  GenerationRequest bad_token = greedy(4);
  bad_token.prompt[0] = -3;
  EXPECT_THROW(engine.submit(bad_token, [](const GenerationEvent&) {}), Error);
}

// A request validated against the engine's own limits is taken as it is; one
// validated against other (wider) limits is checked again with the engine's.
TEST_F(EngineTest, SubmitValidatedChecksAgainOnlyUnderOtherLimits) {
  EngineOptions o;
  o.max_context = 32;
  Engine engine(*model_, *tokenizer_, o);
  GenerationRequest too_long = greedy(4);
  too_long.prompt.assign(40, 5);
  RequestLimits wider = engine.request_limits();
  wider.context = 1000;
  EXPECT_THROW(engine.submit_validated(ValidatedRequest(too_long, wider), [](const GenerationEvent&) {}), RequestError);
  EXPECT_THROW(ValidatedRequest(too_long, engine.request_limits()), RequestError);
  auto done = std::make_shared<std::promise<GenerationEvent>>();
  const auto id = engine.submit_validated(ValidatedRequest(greedy(3), engine.request_limits()),
                                          [done](const GenerationEvent& ev) {
                                            if (ev.finished) done->set_value(ev);
                                          });
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(done->get_future().get().finish_reason, "length");
}

TEST_F(EngineTest, QueueLimitRefusesAndShutdownFinishes) {
  EngineOptions o;
  o.max_queue = 2;
  Engine engine(*model_, *tokenizer_, o);
  std::atomic<int> finished{0};
  int accepted = 0, refused = 0;
  for (int i = 0; i < 8; ++i) {
    auto id = engine.submit(greedy(20), [&](const GenerationEvent& ev) {
      if (ev.finished) ++finished;
    });
    id ? ++accepted : ++refused;
  }
  EXPECT_GT(refused, 0);
  engine.shutdown(true);
  EXPECT_EQ(finished.load(), accepted);
  EXPECT_FALSE(engine.submit(greedy(2), [](const GenerationEvent&) {}).has_value());
}
