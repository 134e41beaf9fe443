#pragma once
// The engine's cumulative counters (steps, tokens, speculation, peaks) as the
// engine thread keeps them, without a lock.
#include <cstdint>

#include "engine/engine.h"

namespace kvserve {

// What the engine thread counts as it goes, without a lock: publish_metrics()
// copies it into the shared snapshot once per loop iteration, and before a
// request's final event.
struct EngineCounters {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prompt_tokens_total = 0;
  int64_t requests_finished = 0;
  int64_t spec_rounds = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t kv_blocks_used_peak = 0;
  int64_t kv_sliding_blocks_used_peak = 0;
  int64_t kv_bytes_used_peak = 0;

  void copy_to(EngineMetrics& m) const {
    m.steps = steps;
    m.preemptions = preemptions;
    m.prefix_query_tokens = prefix_query_tokens;
    m.prefix_hit_tokens = prefix_hit_tokens;
    m.prompt_tokens_total = prompt_tokens_total;
    m.requests_finished = requests_finished;
    m.spec_rounds = spec_rounds;
    m.spec_draft_tokens = spec_draft_tokens;
    m.spec_accepted_tokens = spec_accepted_tokens;
    m.kv_blocks_used_peak = kv_blocks_used_peak;
    m.kv_sliding_blocks_used_peak = kv_sliding_blocks_used_peak;
    m.kv_bytes_used_peak = kv_bytes_used_peak;
  }
};

}  // namespace kvserve
