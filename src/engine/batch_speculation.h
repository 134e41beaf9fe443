#pragma once
// Speculative decoding inside the batching engine, one request's side: the
// prompt-lookup drafter's proposals, their verification with the exact rule
// shared with SpeculativeSession (verify_draft), adaptive k, and the
// settings' validation. The scheduler places the drafts in the batch
// (Scheduler::schedule with a DraftSource) and rolls rejected ones back
// (Scheduler::resolve_drafts); engine.cpp joins the two.
//
// Draft-model drafts are not supported in the engine (each sequence would need
// a second paged KV allocation and k batched draft passes per step): requests
// asking for them are refused; `kvserve run --spec draft` runs them for one
// sequence.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/ngram_draft.h"
#include "engine/speculative.h"
#include "sampling/sampler.h"

namespace kvserve {

constexpr int64_t kMaxEngineDraftK = 32;

// Throws kvserve::Error for settings the engine cannot run: draft-model mode,
// or draft_k outside [1, kMaxEngineDraftK] with speculation on.
void validate_speculation(const SpeculationSettings& settings);

// "none", "ngram" or "draft"; throws kvserve::Error naming the choices.
SpeculativeMode parse_speculative_mode(const std::string& name);
const char* speculative_mode_name(SpeculativeMode mode);

class RequestSpeculation {
 public:
  explicit RequestSpeculation(const SpeculationSettings& settings);
  bool enabled() const { return settings_.mode != SpeculativeMode::kNone; }
  // At most min(k, max_drafts) drafts to follow `history` (prompt + generated),
  // kept until verify(); none when speculation is off or nothing matches.
  std::span<const int32_t> propose(std::span<const int32_t> history, int64_t max_drafts, Sampler& sampler);
  // Verifies the last proposal's n_draft drafts against the target's rows
  // [n_draft + 1][vocab] (row i after history and the first i drafts):
  // `produced` gets the round's 1..n_draft+1 tokens; returns the drafts
  // accepted. Adapts k when adaptive.
  int64_t verify(std::span<const float> rows, int64_t n_draft, std::span<const int32_t> history, Sampler& sampler,
                 VerifyScratch& scratch, std::vector<int32_t>& produced);

 private:
  SpeculationSettings settings_;
  int64_t k_;  // drafts of the next round at most (draft_k unless adaptive)
  NgramDrafter drafter_;
  DraftProposal proposal_;
};

}  // namespace kvserve
