#pragma once
// The engine step's draft stage: what a decoding sequence proposes for the
// scheduler to place after its token (the Scheduler's DraftSource), and the
// draft model's batched passes that fill those places in before the target's
// pass verifies them, with the draft model's timing for auto speculation.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "decode/sequence.h"
#include "grammar/token_constraint.h"
#include "sampling/sampler.h"
#include "speculation/draft_model_batch.h"
#include "speculation/request_speculation.h"
#include "speculation/speculation_policy.h"

namespace kvserve {

// One decoding sequence's drafting state as the draft stage sees it (the engine's SequenceState).
struct DraftingSequence {
  RequestSpeculation* spec = nullptr;
  Sampler* sampler = nullptr;
  TokenMatcher* matcher = nullptr;  // the sequence's output constraint; null: free
  int64_t remaining_tokens = 0;     // what the request may still generate on this sequence
};

class DraftStage {
 public:
  // `draft`: the engine's draft model (null: none); `policy`: auto
  // speculation's state, which run() teaches the draft model's costs.
  DraftStage(DraftModelBatch* draft, SpeculationPolicy& policy);

  // At most max_drafts drafts to follow `seq` (see DraftSource), fewer where
  // a round's drafts + 1 tokens would pass the sequence's remaining tokens or
  // the sequence's K/V slots; a deterministic proposal is cut at the first
  // draft the sequence's constraint rejects.
  std::span<const int32_t> propose(const Sequence& seq, const DraftingSequence& drafting, int64_t max_drafts,
                                   int64_t batch_tokens);

  // The draft model's passes for every scheduled chunk (a ScheduledChunk:
  // .seq, .n_draft) whose drafts await them, batched, before the target's
  // pass that verifies them: the placeholders in the sequences' tokens become
  // the drafts. drafting_of(seq) gives a sequence's DraftingSequence. Returns
  // whether any pass ran.
  template <class Chunks, class DraftingOf>
  bool run(const Chunks& chunks, DraftingOf&& drafting_of) {
    requests_.clear();
    drafting_.clear();
    for (const auto& c : chunks)
      if (c.n_draft > 0) add(*c.seq, c.n_draft, drafting_of(*c.seq));
    return run_added();
  }
  // Draft model forward passes run so far (the engine's metric).
  int64_t passes() const { return draft_->passes(); }

 private:
  void add(Sequence& seq, int64_t n_draft, const DraftingSequence& drafting);
  bool run_added();
  void observe_costs(double seconds, int64_t passes);

  DraftModelBatch* draft_;
  SpeculationPolicy& policy_;
  std::vector<DraftModelRequest> requests_;                            // the current step's
  std::vector<std::pair<Sequence*, RequestSpeculation*>> drafting_;  // their sequences, in the same order
};

}  // namespace kvserve
