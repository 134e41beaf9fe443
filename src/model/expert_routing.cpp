#include "model/expert_routing.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kvserve {

void route_tokens(const float* logits, int64_t n, int64_t n_experts, int64_t k, bool normalize,
                  std::span<ExpertChoice> choices) {
  check(k >= 1 && k <= n_experts, "route_tokens: 1 <= k <= n_experts");
  check(static_cast<int64_t>(choices.size()) >= n * k, "route_tokens: room for n * k choices");
  std::vector<float> probs(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* row = logits + t * n_experts;
    const float max = *std::max_element(row, row + n_experts);
    double sum = 0;
    for (int64_t e = 0; e < n_experts; ++e) {
      probs[static_cast<size_t>(e)] = std::exp(row[e] - max);
      sum += probs[static_cast<size_t>(e)];
    }
    for (float& p : probs) p = static_cast<float>(p / sum);
    for (int64_t e = 0; e < n_experts; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const float pa = probs[static_cast<size_t>(a)], pb = probs[static_cast<size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    ExpertChoice* out = choices.data() + t * k;
    float chosen = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = order[static_cast<size_t>(i)];
      out[i] = {e, probs[static_cast<size_t>(e)]};
      chosen += out[i].weight;
    }
    if (!normalize) continue;
    const float divisor = std::max(chosen, 6.103515625e-5f);  // llama.cpp's clamp: the smallest normal f16
    for (int64_t i = 0; i < k; ++i) out[i].weight /= divisor;
  }
}

void group_by_expert(std::span<const ExpertChoice> choices, int64_t k, int64_t n_experts, ExpertGroups& groups) {
  const auto total = static_cast<int64_t>(choices.size());
  groups.offsets.assign(static_cast<size_t>(n_experts) + 1, 0);
  for (const ExpertChoice& c : choices) {
    check(c.expert >= 0 && c.expert < n_experts, "group_by_expert: expert id in range");
    ++groups.offsets[static_cast<size_t>(c.expert) + 1];
  }
  for (size_t e = 1; e < groups.offsets.size(); ++e) groups.offsets[e] += groups.offsets[e - 1];
  groups.rows.resize(static_cast<size_t>(total));
  groups.weights.resize(static_cast<size_t>(total));
  std::vector<int64_t> next(groups.offsets.begin(), groups.offsets.end() - 1);
  // Choices are in row order, so each expert's rows come out in row order.
  for (int64_t i = 0; i < total; ++i) {
    const ExpertChoice& c = choices[static_cast<size_t>(i)];
    const auto slot = static_cast<size_t>(next[static_cast<size_t>(c.expert)]++);
    groups.rows[slot] = i / k;
    groups.weights[slot] = c.weight;
  }
}

}  // namespace kvserve
