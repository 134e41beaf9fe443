#pragma once
// A mixture-of-experts router's decisions (llama.cpp's build_moe_ffn): each
// token's router logits -> softmax (or sigmoid) scores -> the k best experts
// (with DeepSeek-V3's selection bias and expert groups), their scores as
// weights (renormalized to sum 1 when asked), then the batch's tokens grouped by expert so that each
// expert's weights are read once per step for every token routed to it.
#include <cstdint>
#include <span>
#include <vector>

namespace kvserve {

struct ExpertChoice {
  int32_t expert = 0;
  float weight = 0;
};

// How a router turns a token's logits into its k experts (llama.cpp's build_moe_ffn).
struct RouterOptions {
  int64_t n_experts = 0;
  int64_t k = 0;
  bool sigmoid = false;    // each expert's score is sigmoid(logit) (DeepSeek-V3), not the softmax over all
  bool normalize = false;  // the k weights divided by their sum (clamped below at 2^-14, as llama.cpp does)
  // [n_experts] or empty: added to the scores for choosing only (exp_probs_b); weights stay unbiased.
  std::span<const float> selection_bias = {};
  // groups > 1: the experts in `groups` equal runs; only the groups_used runs
  // with the highest sum of their two best (biased) scores may be chosen.
  int64_t groups = 0;
  int64_t groups_used = 0;
};

// choices[t * k .. t * k + k) = token t's experts, best first (ties: the lower
// id), for n tokens of n_experts logits each ([n][n_experts]). Each token's
// choices depend on its own logits only.
void route_tokens(const float* logits, int64_t n, const RouterOptions& options, std::span<ExpertChoice> choices);
// The softmax router (qwen2moe, qwen3moe, deepseek).
inline void route_tokens(const float* logits, int64_t n, int64_t n_experts, int64_t k, bool normalize,
                         std::span<ExpertChoice> choices) {
  route_tokens(logits, n, RouterOptions{n_experts, k, false, normalize}, choices);
}

// The tokens routed to each expert: rows[offsets[e] .. offsets[e + 1]) are
// the batch rows that chose expert e, in row order, and weights[i] the
// weight row rows[i] gave it.
struct ExpertGroups {
  std::vector<int64_t> offsets;  // [n_experts + 1]
  std::vector<int64_t> rows;
  std::vector<float> weights;

  int64_t count(int64_t e) const { return offsets[static_cast<size_t>(e) + 1] - offsets[static_cast<size_t>(e)]; }
};
void group_by_expert(std::span<const ExpertChoice> choices, int64_t k, int64_t n_experts, ExpertGroups& groups);

}  // namespace kvserve
