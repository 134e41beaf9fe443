// The engine step's draft stage without an engine (speculation/draft_stage.h):
// prompt lookup's drafts stay within the tokens a sequence may still generate
// and its sequence's K/V slots, and a constraint cuts a deterministic
// proposal at the first draft it rejects, its own state rolled back.
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "decode/sequence.h"
#include "grammar/token_constraint.h"
#include "sampling/sampler.h"
#include "speculation/draft_stage.h"
#include "speculation/request_speculation.h"
#include "speculation/speculation_policy.h"

namespace kvserve {
namespace {

// Accepts tokens below `limit`, counting what it holds.
class BelowMatcher : public TokenMatcher {
 public:
  explicit BelowMatcher(int32_t limit) : limit_(limit) {}
  void mask(std::span<float>) override {}
  bool accept(int32_t token) override {
    if (token >= limit_) return false;
    accepted++;
    return true;
  }
  void rollback(int32_t n) override { accepted -= n; }
  bool finished() override { return false; }
  int32_t accepted = 0;

 private:
  int32_t limit_;
};

std::vector<int32_t> to_vector(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

struct Fixture {
  SpeculationPolicy policy;
  DraftStage stage{nullptr, policy};
  RequestSpeculation spec{SpeculationSettings{SpeculativeMode::kNgram, 8, false}, SpeculationContext{}};
  Sampler sampler{SamplingParams{.temperature = 0}};
  Sequence seq;
  Fixture() {
    seq.id = 1;
    seq.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3};  // "1 2 3" again: lookup proposes 4 5 6 7 8 9 1 2
    seq.max_kv_tokens = 100;
  }
  DraftingSequence drafting(int64_t remaining, TokenMatcher* matcher = nullptr) {
    return {&spec, &sampler, matcher, remaining};
  }
};

TEST(DraftStage, ProposalsStayWithinTheTokensLeftAndTheKVSlots) {
  Fixture f;
  EXPECT_EQ(to_vector(f.stage.propose(f.seq, f.drafting(100), 8, 1)),
            (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 1, 2}));
  EXPECT_EQ(f.stage.propose(f.seq, f.drafting(100), 5, 1).size(), 5u);  // the scheduler's max_drafts
  EXPECT_EQ(f.stage.propose(f.seq, f.drafting(4), 8, 1).size(), 3u);    // a round yields drafts + 1 tokens
  EXPECT_TRUE(f.stage.propose(f.seq, f.drafting(1), 8, 1).empty());
  f.seq.max_kv_tokens = f.seq.num_tokens() + 2;
  EXPECT_EQ(f.stage.propose(f.seq, f.drafting(100), 8, 1).size(), 2u);
}

TEST(DraftStage, AConstraintCutsADeterministicProposalAtItsFirstRejection) {
  Fixture f;
  BelowMatcher below_seven(7);
  const auto drafts = f.stage.propose(f.seq, f.drafting(100, &below_seven), 8, 1);
  EXPECT_EQ(to_vector(drafts), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(below_seven.accepted, 0);  // the matcher is where it was: verification accepts for real
}

}  // namespace
}  // namespace kvserve
