#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"

using kvserve::Sampler;
using kvserve::SamplingParams;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// No truncation, temperature 1: distribution() is then the plain softmax.
SamplingParams untruncated() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& v : logits) v = normal(gen);
  return logits;
}

std::vector<double> softmax(const std::vector<float>& logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> out;
  for (float v : logits) out.push_back(std::exp(static_cast<double>(v) - max_logit));
  const double sum = std::accumulate(out.begin(), out.end(), 0.0);
  for (double& v : out) v /= sum;
  return out;
}

std::vector<float> distribution_of(const SamplingParams& params, std::vector<float> logits,
                                   const std::vector<int32_t>& history = {}) {
  Sampler sampler(params);
  std::vector<float> probs;
  sampler.distribution(logits, history, probs);
  return probs;
}

std::vector<int32_t> kept_ids(const std::vector<float>& probs) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < probs.size(); ++i)
    if (probs[i] > 0.0f) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

double entropy(const std::vector<float>& probs) {
  double h = 0.0;
  for (float p : probs)
    if (p > 0.0f) h -= p * std::log(static_cast<double>(p));
  return h;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kvserve::Error& e) {
    return e.what();
  }
  return "(no kvserve::Error thrown)";
}

// The chain written the slow, literal way: full sort, steps in the documented
// order, renormalizing after each cut. The sampler must agree with it.
std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != -kInf) order.push_back(static_cast<int32_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(static_cast<size_t>(p.top_k));
  std::vector<double> probs;
  for (int32_t id : order) probs.push_back(std::exp((static_cast<double>(logits[id]) - logits[order[0]]) / p.temperature));
  auto renormalize = [&] {
    const double sum = std::accumulate(probs.begin(), probs.end(), 0.0);
    for (double& v : probs) v /= sum;
  };
  renormalize();
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    size_t keep = 0;
    while (keep < probs.size() && mass < p.top_p) mass += probs[keep++];
    probs.resize(keep);
    renormalize();
  }
  if (p.min_p > 0.0f) {
    const double threshold = p.min_p * probs[0];
    size_t keep = 0;
    while (keep < probs.size() && probs[keep] >= threshold) ++keep;
    probs.resize(keep);
    renormalize();
  }
  std::vector<double> out(logits.size(), 0.0);
  for (size_t i = 0; i < probs.size(); ++i) out[static_cast<size_t>(order[i])] = probs[i];
  return out;
}

}  // namespace

TEST(SamplingGreedy, ZeroTemperatureIsArgmax) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> logits = random_logits(1000, seed);
    const int32_t expected = kvserve::argmax(logits);
    EXPECT_EQ(sampler.sample(logits, {}), expected);
  }
}

TEST(SamplingGreedy, TiesGoToLowestId) {
  std::vector<float> logits = {1.0f, 5.0f, -kInf, 5.0f, 5.0f};
  EXPECT_EQ(kvserve::argmax(logits), 1);
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler(params);
  EXPECT_EQ(sampler.sample(logits, {}), 1);
  std::vector<float> probs;
  std::vector<float> again = {1.0f, 5.0f, -kInf, 5.0f, 5.0f};
  sampler.distribution(again, {}, probs);
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f, 0.0f}));
}

TEST(SamplingGreedy, ArgmaxSkipsNaNAndRejectsEmpty) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(kvserve::argmax(std::vector<float>{nan, -3.0f, nan, -1.0f}), 3);
  EXPECT_THROW(kvserve::argmax(std::vector<float>{}), kvserve::Error);
  EXPECT_THROW(kvserve::argmax(std::vector<float>{nan, nan}), kvserve::Error);
}

TEST(SamplingGreedy, TopKOneEqualsGreedy) {
  SamplingParams params;
  params.top_k = 1;
  params.temperature = 1.5f;
  Sampler sampler(params);
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = random_logits(500, seed);
    if (seed % 5 == 0) logits[7] = logits[300] = *std::max_element(logits.begin(), logits.end()) + 1.0f;  // a tie
    const int32_t expected = kvserve::argmax(logits);
    EXPECT_EQ(sampler.sample(logits, {}), expected) << "seed " << seed;
  }
}

TEST(SamplingSeed, SameSeedSameSequence) {
  SamplingParams params = untruncated();
  params.seed = 1234;
  Sampler a(params), b(params);
  const std::vector<float> logits = random_logits(64, 7, 0.5f);
  for (int i = 0; i < 500; ++i) {
    std::vector<float> la = logits, lb = logits;
    ASSERT_EQ(a.sample(la, {}), b.sample(lb, {})) << "draw " << i;
  }
}

TEST(SamplingSeed, DifferentSeedDifferentSequence) {
  SamplingParams params = untruncated();
  const std::vector<float> logits = random_logits(64, 7, 0.5f);
  auto draw_sequence = [&](uint64_t seed) {
    params.seed = seed;
    Sampler sampler(params);
    std::vector<int32_t> ids;
    for (int i = 0; i < 100; ++i) {
      std::vector<float> row = logits;
      ids.push_back(sampler.sample(row, {}));
    }
    return ids;
  };
  EXPECT_NE(draw_sequence(0), draw_sequence(1));
  EXPECT_NE(draw_sequence(1), draw_sequence(2));
  EXPECT_EQ(draw_sequence(3), draw_sequence(3));
}

TEST(SamplingSeed, UniformIsInUnitIntervalAndSeedZeroIsNotDegenerate) {
  SamplingParams params;
  params.seed = 0;
  Sampler sampler(params);
  double sum = 0.0;
  for (int i = 0; i < 10000; ++i) {
    const double u = sampler.next_uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_NE(sampler.next_random_u64(), sampler.next_random_u64());
}

TEST(SamplingTopP, KeepsSmallestPrefixReachingTopP) {
  // Probabilities by id: id 1 > id 3 > id 2 > id 0.
  const std::vector<double> probs = {0.1, 0.4, 0.2, 0.3};
  SamplingParams params = untruncated();
  const std::vector<std::pair<float, std::vector<int32_t>>> cases = {
      {0.35f, {1}}, {0.65f, {1, 3}}, {0.85f, {1, 2, 3}}, {0.95f, {0, 1, 2, 3}}, {1.0f, {0, 1, 2, 3}}};
  for (const auto& [top_p, expected] : cases) {
    params.top_p = top_p;
    const std::vector<float> out = distribution_of(params, logits_of(probs));
    EXPECT_EQ(kept_ids(out), expected) << "top_p " << top_p;
    double kept_mass = 0.0;
    for (int32_t id : expected) kept_mass += probs[static_cast<size_t>(id)];
    for (int32_t id : expected) EXPECT_NEAR(out[static_cast<size_t>(id)], probs[static_cast<size_t>(id)] / kept_mass, 1e-6);
  }
}

TEST(SamplingMinP, KeepsTokensAboveFractionOfMax) {
  const std::vector<double> probs = {0.5, 0.1, 0.25, 0.15};
  SamplingParams params = untruncated();
  const std::vector<std::pair<float, std::vector<int32_t>>> cases = {
      {0.0f, {0, 1, 2, 3}}, {0.15f, {0, 1, 2, 3}}, {0.25f, {0, 2, 3}}, {0.35f, {0, 2}}, {1.0f, {0}}};
  for (const auto& [min_p, expected] : cases) {
    params.min_p = min_p;
    const std::vector<float> out = distribution_of(params, logits_of(probs));
    EXPECT_EQ(kept_ids(out), expected) << "min_p " << min_p;
    EXPECT_NEAR(std::accumulate(out.begin(), out.end(), 0.0), 1.0, 1e-6);
  }
}

TEST(SamplingMinP, CombinesWithTopPAsTheShorterCut) {
  const std::vector<double> probs = {0.5, 0.1, 0.25, 0.15};
  SamplingParams params = untruncated();
  params.top_p = 0.85f;  // alone keeps {0, 2, 3}
  params.min_p = 0.35f;  // alone keeps {0, 2}
  EXPECT_EQ(kept_ids(distribution_of(params, logits_of(probs))), (std::vector<int32_t>{0, 2}));
  params.top_p = 0.6f;   // alone keeps {0, 2}
  params.min_p = 0.15f;  // alone keeps all
  EXPECT_EQ(kept_ids(distribution_of(params, logits_of(probs))), (std::vector<int32_t>{0, 2}));
}

TEST(SamplingTopK, KeepsKMostLikelyWithTiesToLowerIds) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, -1.0f};
  SamplingParams params = untruncated();
  params.top_k = 3;
  EXPECT_EQ(kept_ids(distribution_of(params, logits)), (std::vector<int32_t>{1, 2, 3}));
  params.top_k = 100;  // more than the vocabulary: no cut
  EXPECT_EQ(kept_ids(distribution_of(params, logits)).size(), logits.size());
  params.top_k = -1;  // disabled
  EXPECT_EQ(kept_ids(distribution_of(params, logits)).size(), logits.size());
}

TEST(SamplingTemperature, HigherTemperatureRaisesEntropy) {
  const std::vector<float> logits = random_logits(200, 11);
  SamplingParams params = untruncated();
  params.temperature = 1.0f;
  const std::vector<float> at_one = distribution_of(params, logits);
  const std::vector<double> expected = softmax(logits);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(at_one[i], expected[i], 1e-6);

  double previous = -1.0;
  for (float t : {0.01f, 0.25f, 0.5f, 1.0f, 2.0f, 4.0f}) {
    params.temperature = t;
    const double h = entropy(distribution_of(params, logits));
    EXPECT_GT(h, previous) << "temperature " << t;
    previous = h;
  }
  EXPECT_LT(previous, std::log(200.0));
  params.temperature = 1e-6f;  // tiny but not greedy: one-hot, no overflow to NaN
  const std::vector<float> cold = distribution_of(params, logits);
  EXPECT_FLOAT_EQ(cold[static_cast<size_t>(kvserve::argmax(logits))], 1.0f);
}

TEST(SamplingPenalties, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams params = untruncated();
  params.repetition_penalty = 2.0f;
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f};
  const std::vector<int32_t> history = {0, 1, 1};
  const std::vector<double> expected = softmax({1.0f, -2.0f, 0.5f, 3.0f});
  const std::vector<float> out = distribution_of(params, logits, history);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-6) << i;
}

TEST(SamplingPenalties, PresenceAndFrequencyFollowOpenAI) {
  SamplingParams params = untruncated();
  params.repetition_penalty = 1.5f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  const std::vector<float> logits = {3.0f, -1.5f, 0.75f, 1.0f};
  const std::vector<int32_t> history = {1, 0, 1, 1, 3};
  // Repetition first, then logit -= count * frequency + presence.
  const std::vector<float> penalized = {3.0f / 1.5f - (0.25f + 0.5f), -1.5f * 1.5f - (3 * 0.25f + 0.5f), 0.75f,
                                        1.0f / 1.5f - (0.25f + 0.5f)};
  const std::vector<double> expected = softmax(penalized);
  const std::vector<float> out = distribution_of(params, logits, history);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-6) << i;
}

TEST(SamplingPenalties, WindowIsTheLastRepeatLastNTokens) {
  SamplingParams params = untruncated();
  params.presence_penalty = 1.0f;
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<int32_t> history = {0, 1, 2, 1};
  params.repeat_last_n = 2;  // window {2, 1}
  EXPECT_EQ(distribution_of(params, logits, history), distribution_of(untruncated(), {0.0f, -1.0f, -1.0f, 0.0f}));
  params.repeat_last_n = -1;  // whole history {0, 1, 2}
  EXPECT_EQ(distribution_of(params, logits, history), distribution_of(untruncated(), {-1.0f, -1.0f, -1.0f, 0.0f}));
  params.repeat_last_n = 0;  // penalties off
  EXPECT_EQ(distribution_of(params, logits, history), distribution_of(untruncated(), logits));
}

TEST(SamplingPenalties, ChangeTheGreedyChoiceAndKeepMaskedTokensMasked) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 3.0f;
  Sampler sampler(params);
  std::vector<float> logits = {2.0f, 1.0f, -kInf};
  const std::vector<int32_t> history = {0, 2};
  EXPECT_EQ(sampler.sample(logits, history), 1);  // 2 / 3 < 1

  SamplingParams sampled = untruncated();
  sampled.presence_penalty = -100.0f;  // a reward: must not unmask token 2
  EXPECT_EQ(distribution_of(sampled, {2.0f, 1.0f, -kInf}, history)[2], 0.0f);
}

TEST(SamplingEmpirical, DrawFrequenciesMatchDistribution) {
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 12;
  params.top_p = 0.9f;
  params.min_p = 0.02f;
  params.repetition_penalty = 1.3f;
  params.seed = 42;
  const std::vector<float> logits = random_logits(48, 5, 1.5f);
  const std::vector<int32_t> history = {3, 3, 17, 40};
  Sampler sampler(params);
  std::vector<float> row = logits, probs;
  sampler.distribution(row, history, probs);

  constexpr int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    row = logits;
    ++counts[static_cast<size_t>(sampler.sample(row, history))];
  }
  double chi_square = 0.0;
  int kept = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0f) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    ++kept;
    const double expected = kDraws * static_cast<double>(probs[i]);
    chi_square += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  ASSERT_GE(kept, 4) << "the test distribution should keep several tokens";
  // mean df, sd sqrt(2 df): df + 6 sd is far beyond the 0.999 quantile for
  // these df, yet a wrong draw (e.g. ignoring a cut) exceeds it by orders.
  const double df = kept - 1;
  EXPECT_LT(chi_square, df + 6.0 * std::sqrt(2.0 * df)) << "kept " << kept;
}

TEST(SamplingChain, MatchesLiteralReferenceOnRandomSettings) {
  std::mt19937 gen(99);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    SamplingParams params;
    params.temperature = 0.2f + 2.0f * unit(gen);
    params.top_k = static_cast<int32_t>(gen() % 300) - 50;  // some disabled
    params.top_p = trial % 3 == 0 ? 1.0f : 0.05f + 0.95f * unit(gen);
    params.min_p = trial % 4 == 0 ? 0.0f : 0.3f * unit(gen);
    std::vector<float> logits = random_logits(2000, static_cast<uint32_t>(trial), 2.0f);
    for (size_t i = 0; i < logits.size(); i += 7) logits[i] = -kInf;
    const std::vector<double> expected = reference_distribution(logits, params);
    const std::vector<float> out = distribution_of(params, logits);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i] > 0.0f, expected[i] > 0.0) << "trial " << trial << " token " << i;
      ASSERT_NEAR(out[i], expected[i], 1e-5) << "trial " << trial << " token " << i;
    }
  }
}

TEST(SamplingChain, LargeVocabularyTopPOnly) {
  SamplingParams params = untruncated();
  params.top_p = 0.9f;  // no top-k or min-p: exercises the chunked partial sort
  const std::vector<float> logits = random_logits(150000, 3, 1.0f);
  const std::vector<double> expected = reference_distribution(logits, params);
  const std::vector<float> out = distribution_of(params, logits);
  EXPECT_GT(kept_ids(out).size(), 10000u);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i] > 0.0f, expected[i] > 0.0) << "token " << i;
    ASSERT_NEAR(out[i], expected[i], 1e-7) << "token " << i;
  }
}

TEST(SamplingLogSoftmax, IsLogOfSoftmaxOfRawLogits) {
  const std::vector<float> logits = {1000.0f, 1001.0f, -kInf, 998.5f};
  std::vector<float> out;
  Sampler::log_softmax(logits, out);
  const std::vector<double> probs = softmax(logits);
  ASSERT_EQ(out.size(), logits.size());
  EXPECT_EQ(out[2], -kInf);
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (i != 2) {
      EXPECT_NEAR(out[i], std::log(probs[i]), 1e-5);
    }
    total += std::exp(static_cast<double>(out[i]));
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_THROW(Sampler::log_softmax(std::vector<float>{-kInf, -kInf}, out), kvserve::Error);
}

TEST(SamplingValidation, RejectsBadParamsNamingTheField) {
  const std::vector<std::pair<std::function<void(SamplingParams&)>, std::string>> cases = {
      {[](SamplingParams& p) { p.temperature = -0.1f; }, "temperature must be"},
      {[](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature must be"},
      {[](SamplingParams& p) { p.temperature = kInf; }, "temperature must be"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0"},
      {[](SamplingParams& p) { p.min_p = -0.1f; }, "min_p must be in [0, 1]"},
      {[](SamplingParams& p) { p.min_p = 1.01f; }, "min_p must be in [0, 1]"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty must be"},
      {[](SamplingParams& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty must be"},
      {[](SamplingParams& p) { p.repeat_last_n = -2; }, "repeat_last_n must be >= -1"},
      {[](SamplingParams& p) { p.presence_penalty = kInf; }, "presence_penalty must be finite"},
      {[](SamplingParams& p) { p.frequency_penalty = std::nanf(""); }, "frequency_penalty must be finite"},
  };
  for (const auto& [mutate, message] : cases) {
    SamplingParams params;
    mutate(params);
    const std::string error = error_of([&] { Sampler sampler(params); });
    EXPECT_NE(error.find(message), std::string::npos) << "got: " << error;
  }
}

TEST(SamplingValidation, AcceptsEdgeValues) {
  SamplingParams params;
  params.temperature = 0.0f;  // greedy
  params.top_k = -1;          // disabled, like 0
  params.top_p = 1.0f;
  params.min_p = 1.0f;
  params.repeat_last_n = -1;
  params.presence_penalty = -2.0f;
  EXPECT_NO_THROW(params.validate());
  params.top_k = 0;
  params.min_p = 0.0f;
  EXPECT_NO_THROW(params.validate());
}

TEST(SamplingValidation, RejectsBadLogitsAndHistory) {
  SamplingParams params;
  params.repetition_penalty = 1.1f;
  Sampler sampler(params);
  std::vector<float> empty;
  EXPECT_NE(error_of([&] { sampler.sample(empty, {}); }).find("logits must not be empty"), std::string::npos);
  std::vector<float> with_nan = {0.0f, std::nanf("")};
  EXPECT_NE(error_of([&] { sampler.sample(with_nan, {}); }).find("logits[1]"), std::string::npos);
  std::vector<float> with_inf = {kInf, 0.0f};
  EXPECT_NE(error_of([&] { sampler.sample(with_inf, {}); }).find("logits[0]"), std::string::npos);
  std::vector<float> all_masked = {-kInf, -kInf};
  EXPECT_NE(error_of([&] { sampler.sample(all_masked, {}); }).find("masked"), std::string::npos);
  std::vector<float> logits = {0.0f, 1.0f};
  const std::vector<int32_t> history = {0, 2};
  EXPECT_NE(error_of([&] { sampler.sample(logits, history); }).find("history holds token id 2"), std::string::npos);
}

TEST(SamplingMask, MaskedTokensAreNeverDrawn) {
  SamplingParams params = untruncated();
  params.temperature = 5.0f;
  Sampler sampler(params);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> logits = {0.0f, -kInf, 0.0f, -kInf};
    const int32_t id = sampler.sample(logits, {});
    ASSERT_TRUE(id == 0 || id == 2) << id;
  }
}
