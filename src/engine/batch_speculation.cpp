#include "engine/batch_speculation.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

void validate_speculation(const SpeculationSettings& settings) {
  if (settings.mode == SpeculativeMode::kNone) return;
  if (settings.mode == SpeculativeMode::kDraftModel)
    throw Error("draft-model speculation is not supported by the batching engine (only n-gram / prompt-lookup "
                "drafts: speculative mode \"ngram\"); use `kvserve run --spec draft` for one sequence");
  if (settings.draft_k < 1 || settings.draft_k > kMaxEngineDraftK)
    throw Error("draft_k must be in [1, " + std::to_string(kMaxEngineDraftK) + "], got " +
                std::to_string(settings.draft_k));
}

SpeculativeMode parse_speculative_mode(const std::string& name) {
  if (name == "none") return SpeculativeMode::kNone;
  if (name == "ngram") return SpeculativeMode::kNgram;
  if (name == "draft") return SpeculativeMode::kDraftModel;
  throw Error("unknown speculative mode '" + name + "': expected none, ngram or draft");
}

const char* speculative_mode_name(SpeculativeMode mode) {
  switch (mode) {
    case SpeculativeMode::kNgram: return "ngram";
    case SpeculativeMode::kDraftModel: return "draft";
    case SpeculativeMode::kNone: break;
  }
  return "none";
}

RequestSpeculation::RequestSpeculation(const SpeculationSettings& settings)
    : settings_(settings), k_(settings.draft_k) {}

std::span<const int32_t> RequestSpeculation::propose(std::span<const int32_t> history, int64_t max_drafts,
                                                     Sampler& sampler) {
  proposal_.tokens.clear();
  proposal_.probs.clear();
  if (!enabled() || max_drafts <= 0) return {};
  drafter_.propose(history, std::min(k_, max_drafts), sampler, proposal_);
  return proposal_.tokens;
}

int64_t RequestSpeculation::verify(std::span<const float> rows, int64_t n_draft, std::span<const int32_t> history,
                                   Sampler& sampler, VerifyScratch& scratch, std::vector<int32_t>& produced) {
  check(n_draft == static_cast<int64_t>(proposal_.tokens.size()), "the batch verifies the whole proposal");
  const int64_t accepted = verify_draft(rows, proposal_, history, sampler, scratch, produced);
  if (settings_.adaptive_k) k_ = adapt_draft_k(k_, n_draft, accepted, settings_.draft_k);
  return accepted;
}

}  // namespace kvserve
