#include "model/expert_routing.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "core/error.h"

namespace kvserve {

namespace {

// scores = softmax(row) or sigmoid(row), in place of `scores` ([n_experts]).
void gate_scores(const float* row, int64_t n_experts, bool sigmoid, std::vector<float>& scores) {
  if (sigmoid) {
    for (int64_t e = 0; e < n_experts; ++e) scores[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-row[e]));
    return;
  }
  const float max = *std::max_element(row, row + n_experts);
  double sum = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    scores[static_cast<size_t>(e)] = std::exp(row[e] - max);
    sum += scores[static_cast<size_t>(e)];
  }
  for (float& p : scores) p = static_cast<float>(p / sum);
}

// Masks (to -inf) every expert outside the groups_used groups whose two best scores sum highest.
void keep_best_groups(const RouterOptions& o, std::vector<float>& selection) {
  const int64_t per_group = o.n_experts / o.groups;
  std::vector<std::pair<float, int64_t>> group_scores;
  for (int64_t g = 0; g < o.groups; ++g) {
    const auto first = selection.begin() + g * per_group;
    std::vector<float> members(first, first + per_group);
    std::partial_sort(members.begin(), members.begin() + 2, members.end(), std::greater<>());
    group_scores.push_back({members[0] + members[1], g});
  }
  std::partial_sort(group_scores.begin(), group_scores.begin() + o.groups_used, group_scores.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<bool> kept(static_cast<size_t>(o.groups), false);
  for (int64_t i = 0; i < o.groups_used; ++i) kept[static_cast<size_t>(group_scores[static_cast<size_t>(i)].second)] = true;
  for (int64_t e = 0; e < o.n_experts; ++e)
    if (!kept[static_cast<size_t>(e / per_group)]) selection[static_cast<size_t>(e)] = -INFINITY;
}

}  // namespace

void route_tokens(const float* logits, int64_t n, const RouterOptions& o, std::span<ExpertChoice> choices) {
  const int64_t n_experts = o.n_experts, k = o.k;
  check(k >= 1 && k <= n_experts, "route_tokens: 1 <= k <= n_experts");
  check(static_cast<int64_t>(choices.size()) >= n * k, "route_tokens: room for n * k choices");
  check(o.selection_bias.empty() || static_cast<int64_t>(o.selection_bias.size()) == n_experts,
        "route_tokens: one selection bias per expert");
  const bool grouped = o.groups > 1;
  check(!grouped || (n_experts % o.groups == 0 && n_experts / o.groups >= 2 && o.groups_used >= 1 &&
                     o.groups_used < o.groups && o.groups_used * (n_experts / o.groups) >= k),
        "route_tokens: expert groups split the experts evenly, two or more each, and the used ones hold k");
  std::vector<float> probs(static_cast<size_t>(n_experts)), selection(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    gate_scores(logits + t * n_experts, n_experts, o.sigmoid, probs);
    selection = probs;
    for (size_t e = 0; e < o.selection_bias.size(); ++e) selection[e] += o.selection_bias[e];
    if (grouped) keep_best_groups(o, selection);
    for (int64_t e = 0; e < n_experts; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const float pa = selection[static_cast<size_t>(a)], pb = selection[static_cast<size_t>(b)];
      return pa > pb || (pa == pb && a < b);
    });
    ExpertChoice* out = choices.data() + t * k;
    float chosen = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = order[static_cast<size_t>(i)];
      out[i] = {e, probs[static_cast<size_t>(e)]};
      chosen += out[i].weight;
    }
    if (!o.normalize) continue;
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
