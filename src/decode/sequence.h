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
  // A request that asks for its prompt's logprobs: the logits of every prompt
  // row are wanted, and a prefix hit may cover no row not scored yet.
  bool scores_prompt = false;
  int64_t prompt_rows_scored = 0;  // rows [0, this) scored (row p gives token p + 1's logprob)

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - prompt_len; }
  int64_t num_uncomputed() const { return num_tokens() - num_computed; }
  // Leading tokens a prefix-cache hit may cover.
  int64_t reusable_prefix() const { return scores_prompt ? prompt_rows_scored : num_tokens(); }
  // Whether the chunk [start, start + n) has prompt rows still to score: all its rows' logits are wanted then.
  bool scores_rows(int64_t start, int64_t n) const {
    return scores_prompt && start + n > prompt_rows_scored && start < prompt_len - 1;
  }
};

}  // namespace kvserve
