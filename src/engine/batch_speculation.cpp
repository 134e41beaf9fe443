#include "engine/batch_speculation.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

void validate_speculation(const SpeculationSettings& settings, bool has_draft_model) {
  if (settings.mode == SpeculativeMode::kNone) return;
  if (settings.mode == SpeculativeMode::kDraftModel && !has_draft_model)
    throw Error("speculative mode 'draft' needs a draft model: start the server with --draft FILE "
                "(EngineOptions::draft_model), or use mode 'ngram'");
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

RequestSpeculation::RequestSpeculation(const SpeculationSettings& settings, const DraftModelSource& draft)
    : settings_(settings), draft_(draft), k_(settings.draft_k) {}

Drafter& RequestSpeculation::drafter() {
  if (settings_.mode != SpeculativeMode::kDraftModel) return ngram_;
  if (!model_drafter_) {
    check(draft_.model != nullptr, "draft-model requests were validated against the engine's draft model");
    const int64_t context = std::min(draft_.max_context, draft_.model->config().context_length);
    model_drafter_ = std::make_unique<ModelDrafter>(*draft_.model, context);
  }
  return *model_drafter_;
}

std::span<const int32_t> RequestSpeculation::propose(std::span<const int32_t> history, int64_t max_drafts,
                                                     Sampler& sampler) {
  proposal_.tokens.clear();
  proposal_.probs.clear();
  if (!enabled() || max_drafts <= 0) return {};
  // ModelDrafter::propose syncs its cache to `history` itself (truncating to
  // the common prefix), so rollbacks and recomputes need no extra commit.
  drafter().propose(history, std::min(k_, max_drafts), sampler, proposal_);
  return proposal_.tokens;
}

void RequestSpeculation::keep_first(int64_t n) {
  check(proposal_.deterministic() && n >= 0 && n <= static_cast<int64_t>(proposal_.tokens.size()),
        "only a deterministic proposal is cut, and only shorter");
  proposal_.tokens.resize(static_cast<size_t>(n));
}

int64_t RequestSpeculation::verify(std::span<const float> rows, int64_t n_draft, std::span<const int32_t> history,
                                   Sampler& sampler, VerifyScratch& scratch, std::vector<int32_t>& produced) {
  check(n_draft == static_cast<int64_t>(proposal_.tokens.size()), "the batch verifies the whole proposal");
  const int64_t accepted = verify_draft(rows, proposal_, history, sampler, scratch, produced);
  if (settings_.adaptive_k) k_ = adapt_draft_k(k_, n_draft, accepted, settings_.draft_k);
  return accepted;
}

}  // namespace kvserve
