#pragma once
// Speculative decoding inside the batching engine, one request's side: the
// drafter's proposals (prompt lookup, or a draft model), their verification
// with the exact rule shared with SpeculativeSession (verify_draft), adaptive
// k, and the settings' validation. The scheduler places the drafts in the
// batch (Scheduler::schedule with a DraftSource) and rolls rejected ones back
// (Scheduler::resolve_drafts); engine.cpp joins the two.
//
// Draft-model mode: each sequence drafts alone with its own ModelDrafter (k
// single-token passes of the draft model over a contiguous KV cache outside
// the paged pool); only the verification is batched. The drafter is created
// at the first proposal, so a request that never speculates costs nothing.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/ngram_draft.h"
#include "engine/speculative.h"
#include "sampling/sampler.h"

namespace kvserve {

constexpr int64_t kMaxEngineDraftK = 32;

// Throws kvserve::Error for settings the engine cannot run: draft-model mode
// without a draft model, or draft_k outside [1, kMaxEngineDraftK] with
// speculation on.
void validate_speculation(const SpeculationSettings& settings, bool has_draft_model);

// "none", "ngram" or "draft"; throws kvserve::Error naming the choices.
SpeculativeMode parse_speculative_mode(const std::string& name);
const char* speculative_mode_name(SpeculativeMode mode);

// Where draft-model drafts come from: the model (null: none) and the most
// tokens a sequence will hold, which sizes its draft KV cache.
struct DraftModelSource {
  const Model* model = nullptr;
  int64_t max_context = 0;
};

class RequestSpeculation {
 public:
  // `draft` is used in draft-model mode only; validate_speculation has
  // checked that it has a model then.
  RequestSpeculation(const SpeculationSettings& settings, const DraftModelSource& draft);
  bool enabled() const { return settings_.mode != SpeculativeMode::kNone; }
  // At most min(k, max_drafts) drafts to follow `history` (prompt + generated),
  // kept until verify(); none when speculation is off or nothing matches. The
  // draft model re-syncs to `history` first (after rejections or a
  // preemption it keeps only the common prefix).
  std::span<const int32_t> propose(std::span<const int32_t> history, int64_t max_drafts, Sampler& sampler);
  // Keeps only the first n drafts of the last proposal, for a deterministic
  // drafter only (cutting a sampled proposal would bias the output).
  void keep_first(int64_t n);
  bool proposal_deterministic() const { return proposal_.deterministic(); }
  // Verifies the last proposal's n_draft drafts against the target's rows
  // [n_draft + 1][vocab] (row i after history and the first i drafts):
  // `produced` gets the round's 1..n_draft+1 tokens; returns the drafts
  // accepted. Adapts k when adaptive.
  int64_t verify(std::span<const float> rows, int64_t n_draft, std::span<const int32_t> history, Sampler& sampler,
                 VerifyScratch& scratch, std::vector<int32_t>& produced);
  // Frees the draft model's KV cache (the request's branch finished).
  void release() { model_drafter_.reset(); }

 private:
  Drafter& drafter();

  SpeculationSettings settings_;
  DraftModelSource draft_;
  int64_t k_;  // drafts of the next round at most (draft_k unless adaptive)
  NgramDrafter ngram_;
  std::unique_ptr<ModelDrafter> model_drafter_;  // draft-model mode, from the first proposal on
  DraftProposal proposal_;
};

}  // namespace kvserve
