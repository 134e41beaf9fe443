#pragma once
// One request's token state as the scheduler sees it (vLLM v1 style): no
// "prefill" or "decode" phase, only tokens known vs tokens computed. Chunked
// prefill, prefix hits and recompute after preemption are all "computed <
// known". Plain data; sampling and text state stay in the engine.
#include <cstdint>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace kvserve {

struct Sequence {
  SequenceId id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated ids
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     // leading tokens whose K/V are in the cache
  int64_t max_kv_tokens = 0;    // K/V slots the sequence may ever use (context and pool limit)
  int64_t num_draft = 0;        // trailing tokens that are unverified drafts (during a step only)
  int64_t prefix_hit_tokens = 0;  // prompt tokens the prefix cache held when the sequence was first admitted

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - prompt_len; }
  int64_t num_uncomputed() const { return num_tokens() - num_computed; }
};

}  // namespace kvserve
