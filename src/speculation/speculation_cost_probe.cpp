#include "speculation/speculation_cost_probe.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <span>

#include "sampling/sampler.h"

namespace kvserve {

SpeculationCostProbe::SpeculationCostProbe(ForwardPass forward, KVCacheManager& kv, DraftModelBatch* draft,
                                           int32_t vocab, int64_t max_batch_tokens, int64_t context_limit)
    : forward_(std::move(forward)), kv_(kv), draft_(draft), vocab_(vocab), max_batch_tokens_(max_batch_tokens),
      context_limit_(context_limit) {}

std::vector<std::pair<int64_t, double>> SpeculationCostProbe::prepare(
    SpeculationPolicy& policy, const std::vector<std::pair<int64_t, double>>& given, bool measure, int threads) {
  policy.step_cost.set_points(given, /*learn_shape=*/false);
  if (measure && !policy.step_cost.measured()) {
    const int caller_threads = omp_get_max_threads();
    if (threads > 0) omp_set_num_threads(threads);
    this->measure(policy);
    omp_set_num_threads(caller_threads);
  }
  return policy.step_cost.points();
}

void SpeculationCostProbe::measure(SpeculationPolicy& policy) {
  measure_step_cost(policy.step_cost);
  measure_draft_cost(policy);
}

// t(n): forward passes over n = 1 .. 17 new tokens after a 32-token context,
// on a scratch sequence outside the scheduler (its blocks are never published
// and go back to the pool), best of three each. Every token's logits are
// computed, as in the steps t(n) stands for (a decode token or a draft each
// needs its output-head row: a quarter of a token's matmuls on
// Qwen2.5-Coder-0.5B; with only the last row, drafts looked cheaper than they
// are and auto lost 4-6% at 4-8 sequences). A pool too small for it leaves
// t(n) proportional to n (drafting never pays then), which is also what a
// compute-bound CPU measures.
void SpeculationCostProbe::measure_step_cost(StepCost& cost) {
  const SequenceId scratch = std::numeric_limits<SequenceId>::max();
  const int64_t context = 32;
  std::vector<int64_t> sizes;
  for (int64_t n : {1, 2, 3, 5, 9, 17})
    if (n <= max_batch_tokens_ && context + n <= context_limit_) sizes.push_back(n);
  std::vector<BlockCopy> copies;
  if (sizes.empty() || !kv_.allocate(scratch, 0, context + sizes.back(), copies)) {
    cost.set_points({{1, 1.0}});
    return;
  }
  std::vector<int32_t> tokens(static_cast<size_t>(context + sizes.back()));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab_));
  logits_.resize(static_cast<size_t>(vocab_) * static_cast<size_t>(sizes.back()));
  const auto pass = [&](int64_t pos0, int64_t n) {
    const auto span = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(pos0), static_cast<size_t>(n));
    const int64_t rows = pos0 == 0 ? 1 : n;  // the context pass only fills the cache
    const SequenceChunk chunk{span, pos0, kv_.blocks(scratch), true, rows, kv_.sliding_blocks(scratch)};
    const auto start = std::chrono::steady_clock::now();
    forward_(chunk, logits_.data());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  pass(0, context);  // also faults the weights in
  // Best of three rounds over every n, the rounds in turn: a slow moment on a shared host then costs one
  // sample of each n rather than bending t(n)'s shape (best of two per n in a row measured t(1) 29 ms where
  // decoding ran at 23, and auto drafted less on the Qwen pair's code: 1.05x instead of 1.36x).
  std::vector<std::pair<int64_t, double>> points;
  for (int64_t n : sizes) points.emplace_back(n, std::numeric_limits<double>::infinity());
  for (int round = 0; round < 3; ++round)
    for (auto& [n, seconds] : points) seconds = std::min(seconds, pass(context, n));
  kv_.free(scratch);
  cost.set_points(points);
}

// The draft model's costs: d, one draft pass, and the catch-up per history
// token, on a scratch sequence (32 tokens fed, then one at a time, best of
// two). Unmeasured, both were 0: every sequence's first choice took the draft
// model for free and paid its prompt's catch-up blind (auto + draft 0.95x at
// four sequences).
void SpeculationCostProbe::measure_draft_cost(SpeculationPolicy& policy) {
  if (draft_ == nullptr) return;
  const SequenceId scratch = std::numeric_limits<SequenceId>::max() - 1;
  const auto vocab = static_cast<size_t>(draft_->vocab_size());
  std::vector<int32_t> history(33);
  for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<int32_t>((i * 7919 + 29) % vocab);
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy);
  DraftProposal proposal;
  const auto timed_run = [&](std::span<const int32_t> h) {
    if (!draft_->reserve(scratch, h, 1)) return 0.0;
    const DraftModelRequest request{scratch, h, 1, &sampler, &proposal};
    const auto start = std::chrono::steady_clock::now();
    draft_->run(std::span<const DraftModelRequest>(&request, 1));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::span<const int32_t> all(history);
  const double catch_up = timed_run(all.first(32));
  const double pass = std::min(timed_run(all), timed_run(all));
  draft_->release(scratch);
  if (!(pass > 0)) return;
  policy.observe_draft_seconds(pass);
  if (catch_up > pass) policy.observe_catch_up_seconds((catch_up - pass) / 32);
}

}  // namespace kvserve
