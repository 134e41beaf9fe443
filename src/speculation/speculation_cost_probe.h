#pragma once
// Auto speculation's costs measured before any request drafts: t(n), one
// engine step over n tokens (StepCost), and the draft model's pass and
// catch-up per token when there is one. The passes run on scratch sequences
// outside the scheduler, whose blocks go back to the pool.
//
// Not thread-safe: the engine runs it on its thread (or before it starts).
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/transformer.h"
#include "speculation/draft_model_batch.h"
#include "speculation/speculation_policy.h"

namespace kvserve {

class SpeculationCostProbe {
 public:
  // One forward pass of the target over one chunk, its logits rows into `logits`.
  using ForwardPass = std::function<void(const SequenceChunk& chunk, float* logits)>;

  // `kv`: the target's K/V manager (a scratch sequence's blocks come from it);
  // `draft`: the engine's draft model batch, null without a draft model.
  // The passes stay within max_batch_tokens and context_limit tokens.
  SpeculationCostProbe(ForwardPass forward, KVCacheManager& kv, DraftModelBatch* draft, int32_t vocab,
                       int64_t max_batch_tokens, int64_t context_limit);

  // The step cost given (`given`, possibly empty), or measured now when
  // `measure` asks for it (with `threads` OpenMP threads when > 0, the
  // caller's count restored after); returns its points.
  std::vector<std::pair<int64_t, double>> prepare(SpeculationPolicy& policy,
                                                  const std::vector<std::pair<int64_t, double>>& given, bool measure,
                                                  int threads);
  // Everything auto speculation weighs: t(n), and the draft model's costs when there is one.
  void measure(SpeculationPolicy& policy);

 private:
  void measure_step_cost(StepCost& cost);
  void measure_draft_cost(SpeculationPolicy& policy);

  ForwardPass forward_;
  KVCacheManager& kv_;
  DraftModelBatch* draft_;
  int32_t vocab_;
  int64_t max_batch_tokens_;
  int64_t context_limit_;
  std::vector<float> logits_;  // [17][vocab] the step passes' rows
};

}  // namespace kvserve
