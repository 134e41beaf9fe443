#include "speculation/draft_stage.h"

#include <algorithm>
#include <chrono>

namespace kvserve {

DraftStage::DraftStage(DraftModelBatch* draft, SpeculationPolicy& policy) : draft_(draft), policy_(policy) {}

std::span<const int32_t> DraftStage::propose(const Sequence& seq, const DraftingSequence& drafting, int64_t max_drafts,
                                             int64_t batch_tokens) {
  RequestSpeculation& spec = *drafting.spec;
  // A round yields up to drafts + 1 tokens: stay within max_tokens and the sequence's K/V slots.
  const int64_t remaining = drafting.remaining_tokens;
  const int64_t limit = std::min({max_drafts, remaining - 1, seq.max_kv_tokens - seq.num_tokens()});
  const std::span<const int32_t> drafts =
      spec.propose(seq.id, seq.tokens, limit, batch_tokens, remaining, *drafting.sampler);
  TokenMatcher* matcher = drafting.matcher;
  if (matcher == nullptr || drafts.empty() || !spec.proposal_deterministic()) return drafts;
  // Cut a deterministic proposal at the first draft the grammar rejects:
  // it would be rejected anyway (probability 0), so the cut only saves work.
  // Drafts after one that completes the output are never used either (that token ends the sequence).
  int32_t valid = 0;
  while (valid < static_cast<int32_t>(drafts.size()) && matcher->accept(drafts[static_cast<size_t>(valid)])) {
    valid++;
    if (matcher->finished()) break;
  }
  matcher->rollback(valid);
  spec.keep_first(valid);
  return drafts.first(static_cast<size_t>(valid));
}

void DraftStage::add(Sequence& seq, int64_t n_draft, const DraftingSequence& drafting) {
  RequestSpeculation& spec = *drafting.spec;
  if (!spec.drafts_pending()) return;
  const auto history = std::span<const int32_t>(seq.tokens).first(static_cast<size_t>(seq.num_tokens() - n_draft));
  requests_.push_back({seq.id, history, n_draft, drafting.sampler, &spec.pending_proposal()});
  drafting_.emplace_back(&seq, &spec);
}

bool DraftStage::run_added() {
  if (requests_.empty()) return false;
  const auto start = std::chrono::steady_clock::now();
  draft_->run(requests_);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  int64_t passes = 0;  // draft positions: one batched draft pass each, whatever the sequences
  for (auto [seq, spec] : drafting_) {
    const std::vector<int32_t>& drafts = spec->pending_proposal().tokens;
    std::copy(drafts.begin(), drafts.end(), seq->tokens.end() - static_cast<std::ptrdiff_t>(drafts.size()));
    spec->drafts_computed();
    passes = std::max(passes, static_cast<int64_t>(drafts.size()));
  }
  observe_costs(took.count(), passes);
  return true;
}

// Auto's d, the draft's seconds per draft position (a pass over every
// drafting sequence; charged in full to each sequence that considers
// drafting, as if it drafted alone: per drafted token, d looked 4x
// cheaper when four sequences had drafted together than a lone drafter
// then paid, and auto + draft lost 4% on code at four sequences). Only
// from rounds without a long catch-up: a first round also prefills the
// prompt into the draft, and counting that once made d so large that the
// draft model was never chosen again (and d never corrected). Runs that
// caught up on more history give the catch-up's cost per token (what is
// left once the drafts' own passes, at d each, are taken out).
void DraftStage::observe_costs(double seconds, int64_t passes) {
  const int64_t catch_up = draft_->last_catch_up_tokens();
  if (catch_up <= 2 * static_cast<int64_t>(drafting_.size()))
    policy_.observe_draft_seconds(seconds / static_cast<double>(passes));
  else if (policy_.draft_seconds_per_pass > 0)
    policy_.observe_catch_up_seconds(std::max(0.0, seconds - static_cast<double>(passes) * policy_.draft_seconds_per_pass) /
                                     static_cast<double>(catch_up));
}

}  // namespace kvserve
