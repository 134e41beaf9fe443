// The OutputProcessor (engine/output_processor.h) without an engine: one
// sequence's state over a tiny tokenizer's vocabulary, random rows of an awkward size.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "engine/output_processor.h"
#include "tiny_vocab.h"

using namespace kvserve;

namespace {

constexpr int kProcessorVocab = 397;  // prime

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(n);
  for (float& v : row) v = normal(gen);
  return row;
}

struct SequenceFixture {
  explicit SequenceFixture(GenerationRequest request)
      : tokenizer(test_util::tiny_bpe_tokenizer(kProcessorVocab)), r(std::move(request)),
        state(r, 0, tokenizer, SpeculationContext{}, std::make_shared<const StopStrings>(r.stop), {}) {
    seq.max_kv_tokens = 1000;
  }
  Tokenizer tokenizer;
  GenerationRequest r;
  SequenceState state;
  Sequence seq;
};

}  // namespace

TEST(OutputProcessor, LogprobsAreTheRowsLogSoftmaxWithTheTopKMostLikelyFirst) {
  GenerationRequest r;
  r.top_logprobs = 7;
  SequenceFixture f(r);
  OutputProcessor out(f.tokenizer);
  const std::vector<float> row = random_logits(kProcessorVocab, 11);
  std::vector<float> want;
  Sampler::log_softmax(row, want);
  std::vector<int32_t> order(kProcessorVocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return want[static_cast<size_t>(a)] > want[static_cast<size_t>(b)]; });
  for (int round = 0; round < 2; ++round) {  // the buffers are reused
    GenerationEvent ev;
    const auto log_probs = out.log_probs(row);
    EXPECT_EQ(out.take_token(f.seq, f.r, f.state, 42, 1, log_probs, ev), FinishReason::kNone);
    ASSERT_EQ(ev.logprobs.size(), 1u);
    EXPECT_EQ(ev.logprobs[0].id, 42);
    EXPECT_FLOAT_EQ(ev.logprobs[0].logprob, want[42]);
    ASSERT_EQ(ev.logprobs[0].top.size(), 7u);
    for (size_t i = 0; i < 7; ++i) {
      EXPECT_EQ(ev.logprobs[0].top[i].first, order[i]);
      EXPECT_FLOAT_EQ(ev.logprobs[0].top[i].second, want[static_cast<size_t>(order[i])]);
    }
  }
  EXPECT_EQ(out.tokens_taken(), 2);
}

TEST(OutputProcessor, TopLogprobsBeyondTheVocabularyListEveryToken) {
  GenerationRequest r;
  r.top_logprobs = kProcessorVocab + 5;
  SequenceFixture f(r);
  OutputProcessor out(f.tokenizer);
  std::vector<float> row = random_logits(kProcessorVocab, 12);
  row[3] = -std::numeric_limits<float>::infinity();
  GenerationEvent ev;
  out.take_token(f.seq, f.r, f.state, 5, 1, out.log_probs(row), ev);
  ASSERT_EQ(ev.logprobs[0].top.size(), static_cast<size_t>(kProcessorVocab));
  EXPECT_EQ(ev.logprobs[0].top.back().first, 3);  // the masked token last
}

TEST(OutputProcessor, FinishReasons) {
  GenerationRequest r;
  r.max_tokens = 3;
  r.stop_token_ids = {9};
  SequenceFixture f(r);
  OutputProcessor out(f.tokenizer);
  GenerationEvent ev;
  EXPECT_EQ(out.take_token(f.seq, f.r, f.state, 70, 1, {}, ev), FinishReason::kNone);
  EXPECT_TRUE(ev.logprobs.empty());  // none asked for
  EXPECT_EQ(out.take_token(f.seq, f.r, f.state, 9, 2, {}, ev), FinishReason::kStop);
  SequenceFixture g(r);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(out.take_token(g.seq, g.r, g.state, 70, 1, {}, ev), FinishReason::kNone);
  EXPECT_EQ(out.take_token(g.seq, g.r, g.state, 70, 1, {}, ev), FinishReason::kLength);
  SequenceFixture h(GenerationRequest{});
  h.seq.max_kv_tokens = 4;
  EXPECT_EQ(out.take_token(h.seq, h.r, h.state, 70, 5, {}, ev), FinishReason::kLength);  // past the context
  EXPECT_STREQ(to_string(FinishReason::kLength), "length");
  EXPECT_STREQ(to_string(FinishReason::kCancelled), "cancelled");
}
