#pragma once
// What a request asks of speculative decoding (docs/speculative.md), as plain
// settings: the engine's public request carries them (engine/engine.h), a
// request's RequestSpeculation runs them (request_speculation.h).
#include <cstdint>

namespace kvserve {

// Speculative decoding of one request inside the engine (docs/speculative.md):
// each decode step verifies the pending token plus up to draft_k drafts in the
// batched pass. Greedy output is the same token for token; sampled output has
// the same distribution (but other samples than without it for a seed).
enum class SpeculativeMode {
  kNone,
  kNgram,       // prompt lookup: the continuation of the latest earlier n-gram of prompt + output
  kDraftModel,  // a draft model (EngineOptions::draft_model) proposes; refused when the engine has none
  kAuto,        // each step: prompt lookup, the draft model (if the engine has one) or no draft, and k up to
                // draft_k, whichever is expected to give the most tokens per second (speculation_policy.h)
};

struct SpeculationSettings {
  SpeculativeMode mode = SpeculativeMode::kNone;
  int64_t draft_k = 4;      // drafts per verification pass at most, in [1, 32]
  bool adaptive_k = false;  // one fewer draft after a poorly accepted round, one more after a full one
};

// Auto speculation drafts only when it promises at least this gain
// (speculation_policy.h; the engine's default, EngineOptions::spec_min_draft_gain):
// the acceptance and t(n) are estimates, and drafts expected to gain a few
// percent lost as often as they won (Zen 4, Qwen2.5-Coder-0.5B, code at 4
// sequences: 0.84x no speculation with 37% of the drafts accepted).
constexpr double kMinDraftGain = 1.05;

}  // namespace kvserve
