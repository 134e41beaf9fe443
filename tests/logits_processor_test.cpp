// The logits processors (sampling/logits_processor.h) on their own: random
// rows of an awkward vocabulary size and a fake constraint matcher.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "sampling/logits_processor.h"

using namespace kvserve;

namespace {

constexpr size_t kVocab = 1013;  // prime: no row lines up with a SIMD width
constexpr float kMasked = -std::numeric_limits<float>::infinity();

std::vector<float> random_row(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(n);
  for (float& v : row) v = normal(gen);
  return row;
}

// Allows, after s accepted tokens, the ids congruent to s mod 3; complete after `complete_at` tokens.
class FakeMatcher : public TokenMatcher {
 public:
  explicit FakeMatcher(int32_t complete_at = 1000) : complete_at_(complete_at) {}
  bool allows(int32_t token) const { return token % 3 == state % 3; }
  void mask(std::span<float> logits) override {
    masks++;
    for (size_t i = 0; i < logits.size(); ++i)
      if (!allows(static_cast<int32_t>(i))) logits[i] = kMasked;
  }
  bool accept(int32_t token) override {
    if (!allows(token)) return false;
    state++;
    return true;
  }
  void rollback(int32_t n) override { state -= n; }
  bool finished() override { return state >= complete_at_; }
  int32_t state = 0;
  int32_t masks = 0;

 private:
  int32_t complete_at_;
};

}  // namespace

TEST(LogitsProcessor, EmptyChainChangesNothing) {
  LogitsProcessorChain chain;
  EXPECT_FALSE(chain.changes(0));
  std::vector<float> row = random_row(kVocab, 1);
  const std::vector<float> before = row;
  chain.process(row, 0);
  EXPECT_EQ(row, before);
}

TEST(LogitsProcessor, LogitBiasAddsToItsTokensOnly) {
  LogitsProcessorChain chain;
  chain.add(std::make_unique<LogitBias>(std::vector<std::pair<int32_t, float>>{{0, 5.0f}, {1012, -2.5f}, {77, 100.0f}}));
  EXPECT_TRUE(chain.changes(0));
  EXPECT_TRUE(chain.changes(1000));
  std::vector<float> row = random_row(kVocab, 2);
  row[77] = kMasked;
  const std::vector<float> before = row;
  chain.process(row, 3);
  for (size_t i = 0; i < kVocab; ++i) {
    if (i == 0) EXPECT_FLOAT_EQ(row[i], before[i] + 5.0f);
    else if (i == 1012) EXPECT_FLOAT_EQ(row[i], before[i] - 2.5f);
    else if (i == 77) EXPECT_EQ(row[i], kMasked);  // masked stays masked
    else EXPECT_EQ(row[i], before[i]) << i;
  }
}

TEST(LogitsProcessor, MinTokensMasksEndingIdsUntilEnoughAreGenerated) {
  LogitsProcessorChain chain;
  chain.add(std::make_unique<MinTokensMask>(3, std::vector<int32_t>{2, 500, 1012}));
  for (int64_t generated = 0; generated < 5; ++generated) {
    EXPECT_EQ(chain.changes(generated), generated < 3) << generated;
    std::vector<float> row = random_row(kVocab, 3);
    const std::vector<float> before = row;
    chain.process(row, generated);
    for (size_t i = 0; i < kVocab; ++i) {
      const bool ending = i == 2 || i == 500 || i == 1012;
      if (ending && generated < 3) EXPECT_EQ(row[i], kMasked);
      else EXPECT_EQ(row[i], before[i]);
    }
  }
}

TEST(LogitsProcessor, ConstraintMasksInTheMatchersState) {
  FakeMatcher matcher;
  LogitsProcessorChain chain;
  chain.add_constraint(matcher);
  EXPECT_TRUE(chain.changes(0));
  matcher.state = 1;
  std::vector<float> row = random_row(kVocab, 4);
  const std::vector<float> before = row;
  chain.process(row, 0);
  for (size_t i = 0; i < kVocab; ++i) EXPECT_EQ(row[i], i % 3 == 1 ? before[i] : kMasked) << i;
  EXPECT_EQ(matcher.state, 1);
}

TEST(LogitsProcessor, ChainRunsInOrderBiasThenMinTokensThenConstraint) {
  FakeMatcher matcher;
  LogitsProcessorChain chain;
  chain.add(std::make_unique<LogitBias>(std::vector<std::pair<int32_t, float>>{{3, 1.0f}, {6, 1.0f}}));
  chain.add(std::make_unique<MinTokensMask>(1, std::vector<int32_t>{6}));
  chain.add_constraint(matcher);
  std::vector<float> row = random_row(kVocab, 5);
  const std::vector<float> before = row;
  chain.process(row, 0);
  EXPECT_FLOAT_EQ(row[3], before[3] + 1.0f);  // allowed by the constraint, biased
  EXPECT_EQ(row[6], kMasked);                 // biased, then masked by min_tokens
  EXPECT_EQ(row[1], kMasked);                 // the constraint's
}

// Each verification row is processed for its position: the constraint in the
// state its drafts lead to, min_tokens counting the drafts before it.
TEST(LogitsProcessor, RowsFollowTheDraftsAndTheMatcherComesBack) {
  FakeMatcher matcher;
  LogitsProcessorChain chain;
  chain.add(std::make_unique<MinTokensMask>(2, std::vector<int32_t>{9}));
  chain.add_constraint(matcher);
  const std::vector<int32_t> drafts = {0, 4, 8};  // each allowed in turn: states 0, 1, 2
  std::vector<float> rows = random_row(kVocab * (drafts.size() + 1), 6);
  const std::vector<float> before = rows;
  chain.process_rows(rows, kVocab, drafts, /*generated=*/1);
  EXPECT_EQ(matcher.state, 0);
  EXPECT_EQ(matcher.masks, 4);
  for (size_t r = 0; r <= drafts.size(); ++r) {
    for (size_t i = 0; i < kVocab; ++i) {
      const size_t at = r * kVocab + i;
      const bool allowed = i % 3 == r % 3 && !(i == 9 && 1 + r < 2);
      EXPECT_EQ(rows[at], allowed ? before[at] : kMasked) << "row " << r << " token " << i;
    }
  }
}

TEST(LogitsProcessor, RowsAfterARejectedDraftStayAsTheyWere) {
  FakeMatcher matcher;
  LogitsProcessorChain chain;
  chain.add_constraint(matcher);
  const std::vector<int32_t> drafts = {0, 5, 2};  // 5 is rejected in state 1
  std::vector<float> rows = random_row(kVocab * (drafts.size() + 1), 7);
  const std::vector<float> before = rows;
  chain.process_rows(rows, kVocab, drafts, 0);
  EXPECT_EQ(matcher.state, 0);
  EXPECT_EQ(matcher.masks, 2);
  EXPECT_TRUE(std::equal(rows.begin() + 2 * kVocab, rows.end(), before.begin() + 2 * kVocab));
}

TEST(LogitsProcessor, NoRowIsMaskedAfterADraftCompletesTheOutput) {
  FakeMatcher matcher(/*complete_at=*/1);
  LogitsProcessorChain chain;
  chain.add_constraint(matcher);
  const std::vector<int32_t> drafts = {3, 1};
  std::vector<float> rows = random_row(kVocab * 3, 8);
  const std::vector<float> before = rows;
  chain.process_rows(rows, kVocab, drafts, 0);
  EXPECT_EQ(matcher.state, 0);
  EXPECT_EQ(matcher.masks, 1);  // a finished matcher is never asked for a mask
  EXPECT_TRUE(std::equal(rows.begin() + kVocab, rows.end(), before.begin() + kVocab));
}

TEST(LogitsProcessor, RowsWithoutAConstraintEachCountTheirPosition) {
  LogitsProcessorChain chain;
  chain.add(std::make_unique<MinTokensMask>(2, std::vector<int32_t>{0}));
  const std::vector<int32_t> drafts = {5, 6, 7};
  std::vector<float> rows = random_row(kVocab * 4, 9);
  chain.process_rows(rows, kVocab, drafts, 0);
  EXPECT_EQ(rows[0], kMasked);
  EXPECT_EQ(rows[kVocab], kMasked);
  EXPECT_NE(rows[2 * kVocab], kMasked);
  EXPECT_NE(rows[3 * kVocab], kMasked);
}
