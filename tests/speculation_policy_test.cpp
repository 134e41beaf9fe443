// Auto speculation's decision (speculation_policy.h, step_cost.h): the step cost's interpolation
// and correction, the acceptance estimate, and the choice of k: none when a
// step costs in proportion to its tokens, many for a lone sequence whose
// drafts hit when a step costs about the same whatever its size, fewer as the
// batch grows or the acceptance or the draft model's speed drops.
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "speculation/speculation_policy.h"

using namespace kvserve;

namespace {

StepCost cost_of(std::vector<std::pair<int64_t, double>> points) {
  StepCost c;
  c.set_points(std::move(points));
  return c;
}

}  // namespace

TEST(StepCost, InterpolatesBetweenPointsAndExtendsTheLastSlope) {
  const StepCost c = cost_of({{4, 0.02}, {1, 0.01}, {8, 0.04}});
  EXPECT_NEAR(c.seconds(1), 0.01, 1e-12);
  EXPECT_NEAR(c.seconds(2), 0.01 + 0.01 / 3, 1e-12);
  EXPECT_NEAR(c.seconds(6), 0.03, 1e-12);
  EXPECT_NEAR(c.seconds(16), 0.08, 1e-12);  // slope 0.005 per token past 8
  const StepCost one = cost_of({{2, 0.5}});
  EXPECT_NEAR(one.seconds(6), 1.5, 1e-12);  // one point: proportional
  EXPECT_FALSE(StepCost{}.measured());
}

TEST(StepCost, FollowsAHostThatSlowsDownAndShrugsOffOneStall) {
  StepCost c = cost_of({{1, 0.01}, {9, 0.05}});
  for (int i = 0; i < 100; ++i) c.observe(5, 0.06);  // twice the measured 0.03
  EXPECT_NEAR(c.seconds(5), 0.06, 1e-4);
  EXPECT_NEAR(c.seconds(1), 0.02, 1e-4);  // the shape is kept
  c.observe(5, 100.0);  // a stall moves it by at most 4x of one step's weight
  EXPECT_LT(c.seconds(5), 0.06 * 1.4);
}

TEST(StepCost, LearnsTheShapeTheStartUpMeasurementMissed) {
  // Start-up: t(2) / t(1) = 1.12; the engine's real steps: 1.21 (SmolLM2, code at one sequence).
  StepCost c = cost_of({{1, 0.0100}, {2, 0.0112}, {3, 0.0124}});
  for (int i = 0; i < 300; ++i) {
    c.observe(1, 0.0100);
    c.observe(2, 0.0121);
  }
  EXPECT_NEAR(c.seconds(1), 0.0100, 2e-4);
  EXPECT_NEAR(c.seconds(2) / c.seconds(1), 1.21, 0.02);
  // A host that slows down everywhere moves every size at once, the shape learned stays.
  for (int i = 0; i < 100; ++i) {
    c.observe(1, 0.0200);
    c.observe(2, 0.0242);
  }
  EXPECT_NEAR(c.seconds(1), 0.0200, 4e-4);
  EXPECT_NEAR(c.seconds(2) / c.seconds(1), 1.21, 0.02);
  // Long prefills past the last point leave the shape alone.
  const double two_over_one = c.seconds(2) / c.seconds(1);
  for (int i = 0; i < 100; ++i) c.observe(512, 0.5);
  EXPECT_NEAR(c.seconds(2) / c.seconds(1), two_over_one, 1e-9);
}

TEST(StepCost, RefusesPointsItCannotUse) {
  StepCost c;
  EXPECT_THROW(c.set_points({{0, 0.01}}), Error);
  EXPECT_THROW(c.set_points({{1, 0.0}}), Error);
  EXPECT_THROW(c.set_points({{1, -1.0}}), Error);
  EXPECT_THROW(c.set_points({{1, std::numeric_limits<double>::infinity()}}), Error);
}

TEST(AcceptanceRate, StartsAtThePriorAndLearnsTheRate) {
  AcceptanceRate a(0.5, 2.0);
  EXPECT_DOUBLE_EQ(a.rate(), 0.5);
  for (int i = 0; i < 50; ++i) a.observe(4, 3);  // 3 accepted, then a rejection: 0.75
  EXPECT_NEAR(a.rate(), 0.75, 0.03);
  for (int i = 0; i < 50; ++i) a.observe(4, 0);  // the text changed: recent rounds dominate
  EXPECT_LT(a.rate(), 0.1);
  for (int i = 0; i < 50; ++i) a.observe(4, 4);  // all accepted, no rejection
  EXPECT_GT(a.rate(), 0.9);
  a.observe(0, 0);  // no drafts: no evidence
  EXPECT_EQ(a.rounds(), 150);
}

TEST(ExpectedRoundTokens, IsTheGeometricSum) {
  EXPECT_DOUBLE_EQ(expected_round_tokens(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(expected_round_tokens(0.5, 3), 1.875);
  EXPECT_DOUBLE_EQ(expected_round_tokens(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(expected_round_tokens(0.0, 4), 1.0);
}

TEST(ChooseDraftLength, NeverDraftsWhenAStepCostsInProportionToItsTokens) {
  const StepCost linear = cost_of({{1, 0.01}, {2, 0.02}});
  for (double a : {0.0, 0.5, 0.9, 0.99})
    for (int64_t batch : {1, 4, 16}) EXPECT_EQ(choose_draft_length(linear, a, batch, 8, 0).k, 0) << a << " " << batch;
}

TEST(ChooseDraftLength, DraftsMuchForALoneSequenceWhenStepsCostTheSame) {
  const StepCost flat = cost_of({{1, 0.03}, {64, 0.0301}});  // memory-bound: weights read once per step
  const DraftChoice lone = choose_draft_length(flat, 0.9, 1, 8, 0);
  EXPECT_EQ(lone.k, 8);
  EXPECT_NEAR(lone.gain, expected_round_tokens(0.9, 8) * 0.03 / 0.0301 * (0.0301 / flat.seconds(9)), 1e-9);
  EXPECT_EQ(choose_draft_length(flat, 0.0, 1, 8, 0).k, 0);  // drafts that never hit only cost
}

TEST(ChooseDraftLength, ASmallExpectedGainIsNotWorthTheRisk) {
  // t(2) = 1.6 t(1): one draft at acceptance a gains (1 + a) / 1.6.
  const StepCost cost = cost_of({{1, 0.010}, {2, 0.016}});
  const DraftChoice marginal = choose_draft_length(cost, 0.66, 1, 1, 0);  // expected 1.66 / 1.6 = 1.04x
  EXPECT_EQ(marginal.k, 0);
  EXPECT_DOUBLE_EQ(marginal.gain, 1.0);
  const DraftChoice clear = choose_draft_length(cost, 0.8, 1, 1, 0);  // 1.8 / 1.6 = 1.125x
  EXPECT_EQ(clear.k, 1);
  EXPECT_NEAR(clear.gain, 1.125, 1e-9);
}

TEST(ChooseDraftLength, ADraftModelThatMustCatchUpFirstDraftsOnlyForAClearGain) {
  const StepCost flat = cost_of({{1, 0.030}, {9, 0.032}});
  // d = 5 ms per drafted token; at 70% acceptance four drafts pay without a catch-up ...
  const DraftChoice synced = choose_draft_length(flat, 0.7, 1, 4, 0.005);
  EXPECT_GT(synced.k, 0);
  // ... and not after 60 ms of catching up (say 120 history tokens at 0.5 ms),
  EXPECT_EQ(choose_draft_length(flat, 0.7, 1, 4, 0.005, kMinDraftGain, 0.060).k, 0);
  // which near-certain drafts still outweigh.
  EXPECT_GT(choose_draft_length(flat, 0.99, 1, 4, 0.005, kMinDraftGain, 0.010).k, 0);
  EXPECT_LT(choose_draft_length(flat, 0.7, 1, 4, 0.005, kMinDraftGain, 0.010).gain, synced.gain);
}

TEST(ChooseDraftLength, DraftsLessAsTheBatchGrowsOrDraftsGetDearer) {
  // A CPU step: a fixed part (weights streamed) plus a per-token part.
  const StepCost cpu = cost_of({{1, 0.030}, {9, 0.046}});  // 2 ms per extra token
  const int64_t lone = choose_draft_length(cpu, 0.8, 1, 8, 0).k;
  const int64_t four = choose_draft_length(cpu, 0.8, 4, 8, 0).k;
  const int64_t sixteen = choose_draft_length(cpu, 0.8, 16, 8, 0).k;
  EXPECT_GT(lone, 0);
  EXPECT_GE(lone, four);
  EXPECT_GE(four, sixteen);
  EXPECT_EQ(choose_draft_length(cpu, 0.8, 64, 8, 0).k, 0);
  // A draft model whose pass costs as much as the target's never pays.
  EXPECT_EQ(choose_draft_length(cpu, 0.8, 1, 8, 0.030).k, 0);
  EXPECT_GT(choose_draft_length(cpu, 0.8, 1, 8, 0.002).k, 0);
  EXPECT_LE(choose_draft_length(cpu, 0.8, 1, 2, 0).k, 2);  // max_k caps it
}

TEST(ChooseDraftLength, ACatchUpIsSpreadOverTheRoundsTheDraftModelIsExpectedToDraft) {
  // 100 ms of catching up; at 80% acceptance and k = 4 a round yields 3.36 tokens.
  EXPECT_NEAR(amortized_catch_up_seconds(0.100, 0.8, 4, 200), 0.100 / kCatchUpRounds, 1e-12);  // capped
  EXPECT_NEAR(amortized_catch_up_seconds(0.100, 0.8, 4, 5), 0.100 / (5 / expected_round_tokens(0.8, 4)), 1e-12);
  EXPECT_NEAR(amortized_catch_up_seconds(0.100, 0.8, 4, 2), 0.100, 1e-12);  // under one round: all of it
  EXPECT_NEAR(amortized_catch_up_seconds(0.100, 0.8, 0, 0), 0.100, 1e-12);
  EXPECT_EQ(amortized_catch_up_seconds(0, 0.8, 4, 200), 0);
}

TEST(SpeculationPolicy, TriesTheDraftModelBeforeJudgingItOnWhatItLearned) {
  SpeculationPolicy policy;
  EXPECT_EQ(policy.draft_model_prior(), SpeculationPolicy::kProbeDraftAcceptance);
  // A verification as dear as the Qwen2.5-Coder-1.5B's at 8-bit activations, a draft pass a quarter of t(1):
  // the untried prior (0.6) promises nothing, the probe's acceptance does.
  const StepCost dear = cost_of({{1, 0.0226}, {2, 0.0296}, {3, 0.0386}, {5, 0.0615}});
  EXPECT_EQ(choose_draft_length(dear, 0.6, 1, 3, 0.0063).k, 0);
  EXPECT_GT(choose_draft_length(dear, policy.draft_model_prior(), 1, 3, 0.0063).k, 0);
  for (int64_t i = 0; i + 1 < SpeculationPolicy::kDraftProbeRounds; ++i) policy.draft_model_acceptance.observe(4, 0);
  EXPECT_EQ(policy.draft_model_prior(), SpeculationPolicy::kProbeDraftAcceptance);
  policy.draft_model_acceptance.observe(4, 0);
  // Probed: the rate it showed (every round rejected its first draft), not the probe's.
  EXPECT_LT(policy.draft_model_prior(), 0.3);
  EXPECT_EQ(policy.draft_model_prior(), policy.draft_model_acceptance.rate());
}
