// The reasoning gate (grammar/reasoning_gate.h): an output constraint that
// applies only after the thinking, and a thinking budget that forces the end
// tag; with the tags as single tokens (as in Qwen3's vocabulary) and as
// several (the synth vocabulary), and through rollback as speculative
// decoding uses it.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "grammar/reasoning_gate.h"
#include "model/gguf_writer.h"
#include "tiny_vocab.h"

using namespace kvserve;

namespace {

// The synth byte-level vocabulary with <think> and </think> as single
// user-defined tokens, as Qwen3's GGUF files have them.
Tokenizer tokenizer_with_think_tokens() {
  ByteBpeVocab vocab = build_synth_vocab(400);
  constexpr int32_t kUserDefined = 4;
  for (const char* tag : {"<think>", "</think>"}) {
    vocab.tokens.push_back(tag);
    vocab.token_types.push_back(kUserDefined);
  }
  GGUFWriter w;
  test_util::add_bpe_vocab(w, vocab);
  return test_util::tokenizer_from(w);
}

// An inner constraint that allows exactly one token sequence.
class SequenceConstraint final : public CompiledConstraint {
 public:
  explicit SequenceConstraint(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  std::unique_ptr<TokenMatcher> new_matcher() const override { return std::make_unique<Matcher>(tokens_); }

 private:
  class Matcher final : public TokenMatcher {
   public:
    explicit Matcher(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
    void mask(std::span<float> logits) override {
      for (size_t i = 0; i < logits.size(); ++i)
        if (at_ >= tokens_.size() || static_cast<int32_t>(i) != tokens_[at_]) logits[i] = -INFINITY;
    }
    bool accept(int32_t token) override {
      if (at_ >= tokens_.size() || token != tokens_[at_]) return false;
      ++at_;
      return true;
    }
    void rollback(int32_t n) override { at_ -= static_cast<size_t>(n); }
    bool finished() override { return at_ == tokens_.size(); }

   private:
    std::vector<int32_t> tokens_;
    size_t at_ = 0;
  };
  std::vector<int32_t> tokens_;
};

// The tokens a mask leaves allowed.
std::vector<int32_t> allowed(TokenMatcher& m, int32_t vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab), 1.0f);
  m.mask(logits);
  std::vector<int32_t> out;
  for (int32_t i = 0; i < vocab; ++i)
    if (std::isfinite(logits[static_cast<size_t>(i)])) out.push_back(i);
  return out;
}

class ReasoningGateTest : public ::testing::Test {
 protected:
  ReasoningGateTest()
      : tokenizer_(tokenizer_with_think_tokens()), tags_(ReasoningTags::of(tokenizer_, "<think>", "</think>")),
        vocab_(tokenizer_.vocab_size()) {}
  std::vector<int32_t> ids(const std::string& text) const { return tokenizer_.encode(text, false, true); }
  std::unique_ptr<TokenMatcher> matcher(std::shared_ptr<const CompiledConstraint> inner, bool open, int64_t budget) const {
    return gate_after_reasoning(tags_, tokenizer_, std::move(inner), {open, budget})->new_matcher();
  }
  void accept_all(TokenMatcher& m, const std::vector<int32_t>& tokens) const {
    for (int32_t t : tokens) ASSERT_TRUE(m.accept(t)) << "token " << t << " (" << tokenizer_.token_bytes(t) << ")";
  }

  Tokenizer tokenizer_;
  ReasoningTags tags_;
  int32_t vocab_;
};

}  // namespace

TEST_F(ReasoningGateTest, TagsAreFoundAsTokens) {
  ASSERT_EQ(tags_.start_id, ids("<think>").at(0));
  ASSERT_EQ(tags_.end_ids, ids("</think>"));
  ASSERT_EQ(tags_.end_ids.size(), 1u);
  EXPECT_FALSE(tags_.whitespace_ids.empty());
  for (int32_t id : tags_.whitespace_ids) EXPECT_EQ(tokenizer_.token_bytes(id).find_first_not_of(" \t\r\n"), std::string::npos);
  EXPECT_TRUE(std::is_sorted(tags_.whitespace_ids.begin(), tags_.whitespace_ids.end()));
}

TEST_F(ReasoningGateTest, TheBudgetForcesTheEndTagThenTheConstraintApplies) {
  const std::vector<int32_t> answer = ids("{\"a\": 1}");
  const std::vector<int32_t> thought = ids("one two three");
  auto m = matcher(std::make_shared<SequenceConstraint>(answer), true, static_cast<int64_t>(thought.size()));
  for (int32_t t : thought) {  // free while under the budget
    ASSERT_EQ(allowed(*m, vocab_).size(), static_cast<size_t>(vocab_));
    ASSERT_TRUE(m->accept(t));
  }
  EXPECT_EQ(allowed(*m, vocab_), tags_.end_ids);
  EXPECT_FALSE(m->accept(ids(" four").at(0)));
  ASSERT_TRUE(m->accept(tags_.end_ids[0]));
  // Whitespace, then the constraint.
  std::vector<int32_t> first = allowed(*m, vocab_);
  EXPECT_TRUE(std::binary_search(first.begin(), first.end(), answer[0]));
  EXPECT_TRUE(std::binary_search(first.begin(), first.end(), ids("\n\n").at(0)));
  EXPECT_EQ(first.size(), tags_.whitespace_ids.size() + 1);
  accept_all(*m, ids("\n\n"));
  EXPECT_FALSE(m->finished());
  accept_all(*m, answer);
  EXPECT_TRUE(m->finished());
}

TEST_F(ReasoningGateTest, ANaturalEndNeedsNoForcing) {
  auto m = matcher(std::make_shared<SequenceConstraint>(ids("yes")), true, 100);
  accept_all(*m, ids("short thought"));
  // The end tag spelled in pieces (a model need not use the special token).
  accept_all(*m, ids("</"));
  accept_all(*m, ids("think>"));
  EXPECT_EQ(allowed(*m, vocab_).size(), tags_.whitespace_ids.size() + 1);
  accept_all(*m, ids("yes"));
  EXPECT_TRUE(m->finished());
}

TEST_F(ReasoningGateTest, WithoutABudgetTheThinkingIsFree) {
  auto m = matcher(std::make_shared<SequenceConstraint>(ids("x")), true, -1);
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(allowed(*m, vocab_).size(), static_cast<size_t>(vocab_));
    ASSERT_TRUE(m->accept(ids(" word").at(0)));
  }
  EXPECT_FALSE(m->finished());
}

TEST_F(ReasoningGateTest, AnOutputThatMayStartThinkingGetsTheStartTagBesideTheConstraint) {
  const std::vector<int32_t> answer = ids("ok");
  auto m = matcher(std::make_shared<SequenceConstraint>(answer), false, static_cast<int64_t>(ids(" a b").size()));
  EXPECT_EQ(allowed(*m, vocab_), (std::vector<int32_t>{std::min(answer[0], tags_.start_id), std::max(answer[0], tags_.start_id)}));
  ASSERT_TRUE(m->accept(tags_.start_id));
  accept_all(*m, ids(" a b"));
  EXPECT_EQ(allowed(*m, vocab_), tags_.end_ids);  // the budget counts from the start tag
  ASSERT_TRUE(m->accept(tags_.end_ids[0]));
  accept_all(*m, answer);
  EXPECT_TRUE(m->finished());

  // An answer at once: the constraint from the first token, no whitespace first.
  auto direct = matcher(std::make_shared<SequenceConstraint>(answer), false, 2);
  accept_all(*direct, answer);
  EXPECT_TRUE(direct->finished());
  auto no_space = matcher(std::make_shared<SequenceConstraint>(answer), false, 2);
  EXPECT_FALSE(no_space->accept(ids("\n").at(0)));
}

TEST_F(ReasoningGateTest, ABudgetAloneFindsTheStartTagInTheText) {
  auto m = matcher(nullptr, false, static_cast<int64_t>(ids(" a b").size()));
  accept_all(*m, ids("\n <"));
  accept_all(*m, ids("think>"));  // spelled in pieces, after whitespace
  accept_all(*m, ids(" a b"));
  EXPECT_EQ(allowed(*m, vocab_), tags_.end_ids);
  ASSERT_TRUE(m->accept(tags_.end_ids[0]));
  EXPECT_EQ(allowed(*m, vocab_).size(), static_cast<size_t>(vocab_));
  EXPECT_FALSE(m->finished());

  auto plain = matcher(nullptr, false, 0);  // no reasoning: the budget never acts
  accept_all(*plain, ids("Hello there"));
  EXPECT_EQ(allowed(*plain, vocab_).size(), static_cast<size_t>(vocab_));
}

TEST_F(ReasoningGateTest, ACharacterInProgressIsFinishedBeforeForcing) {
  auto m = matcher(nullptr, true, 1);
  const std::vector<int32_t> bytes = ids("\xE4\xB8\x80");  // one character, several byte tokens
  ASSERT_GT(bytes.size(), 1u);
  ASSERT_TRUE(m->accept(bytes[0]));
  for (size_t i = 1; i < bytes.size(); ++i) {
    ASSERT_EQ(allowed(*m, vocab_).size(), static_cast<size_t>(vocab_)) << "byte " << i;
    ASSERT_TRUE(m->accept(bytes[i]));
  }
  EXPECT_EQ(allowed(*m, vocab_), tags_.end_ids);
}

TEST_F(ReasoningGateTest, SeveralTokenTagsAreForcedTokenByToken) {
  const Tokenizer synth = test_util::tiny_bpe_tokenizer();
  const ReasoningTags tags = ReasoningTags::of(synth, "<think>", "</think>");
  ASSERT_EQ(tags.start_id, -1);
  ASSERT_GT(tags.end_ids.size(), 1u);
  const std::vector<int32_t> answer = synth.encode("done", false);
  const std::vector<int32_t> thought = synth.encode(" a b", false);
  auto m = gate_after_reasoning(tags, synth, std::make_shared<SequenceConstraint>(answer),
                                {true, static_cast<int64_t>(thought.size())})->new_matcher();
  for (int32_t t : thought) ASSERT_TRUE(m->accept(t));
  for (int32_t forced : tags.end_ids) {
    ASSERT_EQ(allowed(*m, synth.vocab_size()), std::vector<int32_t>{forced});
    ASSERT_TRUE(m->accept(forced));
  }
  for (int32_t t : answer) ASSERT_TRUE(m->accept(t));
  EXPECT_TRUE(m->finished());
}

// Speculative decoding accepts drafts and rolls them back: after any
// rollback the gate masks as a gate fed only the kept tokens.
TEST_F(ReasoningGateTest, RollbackRestoresEveryState) {
  const std::vector<int32_t> answer = ids("{\"k\": [1, 2]}");
  const auto gate = gate_after_reasoning(tags_, tokenizer_, std::make_shared<SequenceConstraint>(answer), {false, 5});
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    // A path through every phase: tokens drawn from what each mask allows, the start tag first.
    auto walker = gate->new_matcher();
    std::vector<int32_t> path;
    while (!walker->finished() && path.size() < 40) {
      std::vector<int32_t> ok = allowed(*walker, vocab_);
      const int32_t t = path.empty() ? tags_.start_id : ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      ASSERT_TRUE(walker->accept(t));
      path.push_back(t);
    }
    for (size_t keep = 0; keep < path.size(); ++keep) {
      auto rolled = gate->new_matcher();
      accept_all(*rolled, path);
      rolled->rollback(static_cast<int32_t>(path.size() - keep));
      auto fresh = gate->new_matcher();
      accept_all(*fresh, std::vector<int32_t>(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(keep)));
      ASSERT_EQ(allowed(*rolled, vocab_), allowed(*fresh, vocab_)) << "trial " << trial << ", kept " << keep;
      ASSERT_EQ(rolled->finished(), fresh->finished());
    }
  }
}
