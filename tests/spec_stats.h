#pragma once
// Statistics shared by the speculative-decoding tests (single sequence and
// in the batching engine): a chi-square goodness-of-fit test and the exact
// next-token / second-token distributions of a model.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "decode/decoder.h"
#include "model/model.h"
#include "sampling/sampler.h"

namespace kvserve::spec_stats {

// The kernels' OpenMP barriers dominate a tiny model's forward pass on a
// busy machine: the statistical tests run thousands of them single-threaded.
class SingleThreaded {
 public:
  SingleThreaded() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreaded() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

struct ChiSquare {
  double statistic = 0;
  int degrees_of_freedom = 0;
  double critical = 0;  // at significance 1e-3
};

// Goodness of fit of `counts` to `probs`. Bins expecting fewer than 5 draws
// are pooled so that the chi-square approximation holds.
inline ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  int64_t n = 0;
  for (const int64_t c : counts) n += c;
  ChiSquare r;
  double pooled_expected = 0, pooled_observed = 0;
  int bins = 0;
  for (size_t t = 0; t < probs.size(); ++t) {
    const double expected = probs[t] * static_cast<double>(n);
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += static_cast<double>(counts[t]);
      continue;
    }
    r.statistic += std::pow(static_cast<double>(counts[t]) - expected, 2) / expected;
    ++bins;
  }
  if (pooled_expected > 0) {
    r.statistic += std::pow(pooled_observed - pooled_expected, 2) / std::max(pooled_expected, 1e-9);
    ++bins;
  }
  r.degrees_of_freedom = std::max(bins - 1, 1);
  // Wilson-Hilferty: chi2_df quantile ~ df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3, z(1 - 1e-3) = 3.090.
  const double d = r.degrees_of_freedom, h = 2.0 / (9.0 * d);
  r.critical = d * std::pow(1.0 - h + 3.090 * std::sqrt(h), 3);
  return r;
}

inline std::vector<double> next_distribution(const Model& m, std::span<const int32_t> context,
                                             const SamplingParams& params) {
  auto decoder = make_decoder("cached", m, 256);
  std::span<const float> out = decoder->append(context);
  std::vector<float> logits(out.begin(), out.end()), probs;
  Sampler(params).distribution(logits, context, probs);
  return {probs.begin(), probs.end()};
}

// The exact marginal of the second generated token: sum_t p(t) p(. | t).
inline std::vector<double> second_token_distribution(const Model& m, std::span<const int32_t> prompt,
                                                     const SamplingParams& params) {
  const std::vector<double> first = next_distribution(m, prompt, params);
  std::vector<double> marginal(first.size(), 0.0);
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  context.push_back(0);
  for (size_t t = 0; t < first.size(); ++t) {
    if (first[t] == 0) continue;
    context.back() = static_cast<int32_t>(t);
    const std::vector<double> second = next_distribution(m, context, params);
    for (size_t u = 0; u < second.size(); ++u) marginal[u] += first[t] * second[u];
  }
  return marginal;
}

inline void expect_fits(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                        const std::string& what) {
  const ChiSquare c = chi_square(counts, probs);
  EXPECT_LT(c.statistic, c.critical) << what << ": chi2 " << c.statistic << " with " << c.degrees_of_freedom
                                     << " degrees of freedom";
}

}  // namespace kvserve::spec_stats
