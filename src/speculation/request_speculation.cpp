#include "speculation/request_speculation.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

void validate_speculation(const SpeculationSettings& settings, bool has_draft_model) {
  if (settings.mode == SpeculativeMode::kNone) return;
  if (settings.mode == SpeculativeMode::kDraftModel && !has_draft_model)
    throw Error("speculative mode 'draft' needs a draft model: start the server with --draft FILE "
                "(EngineOptions::draft_model), or use mode 'ngram' or 'auto'");
  if (settings.draft_k < 1 || settings.draft_k > kMaxEngineDraftK)
    throw Error("draft_k must be in [1, " + std::to_string(kMaxEngineDraftK) + "], got " +
                std::to_string(settings.draft_k));
}

SpeculativeMode parse_speculative_mode(const std::string& name) {
  if (name == "none") return SpeculativeMode::kNone;
  if (name == "ngram") return SpeculativeMode::kNgram;
  if (name == "draft") return SpeculativeMode::kDraftModel;
  if (name == "auto") return SpeculativeMode::kAuto;
  throw Error("unknown speculative mode '" + name + "': expected none, ngram, draft or auto");
}

const char* speculative_mode_name(SpeculativeMode mode) {
  switch (mode) {
    case SpeculativeMode::kNgram: return "ngram";
    case SpeculativeMode::kDraftModel: return "draft";
    case SpeculativeMode::kAuto: return "auto";
    case SpeculativeMode::kNone: break;
  }
  return "none";
}

RequestSpeculation::RequestSpeculation(const SpeculationSettings& settings, const SpeculationContext& context)
    : settings_(settings), context_(context), k_(settings.draft_k) {}

void RequestSpeculation::propose_from(Source source, SequenceId seq, std::span<const int32_t> history, int64_t k,
                                      Sampler& sampler) {
  source_ = source;
  if (source == Source::kNgram) return ngram_.propose(history, k, sampler, proposal_);
  check(context_.draft != nullptr, "draft-model proposals need the engine's draft model");
  proposal_.tokens.clear();
  proposal_.probs.clear();
  if (!context_.draft->reserve(seq, history, k)) return;  // no room for its K/V: no drafts this step
  proposal_.tokens.assign(static_cast<size_t>(k), 0);
  drafts_pending_ = true;
}

std::span<const int32_t> RequestSpeculation::propose(SequenceId seq, std::span<const int32_t> history,
                                                     int64_t max_drafts, int64_t batch_tokens,
                                                     int64_t remaining_tokens, Sampler& sampler) {
  proposal_.tokens.clear();
  proposal_.probs.clear();
  drafts_pending_ = false;  // a proposal the scheduler did not place is dropped
  if (!enabled() || max_drafts <= 0) return {};
  if (settings_.mode == SpeculativeMode::kAuto)
    return propose_auto(seq, history, max_drafts, batch_tokens, remaining_tokens, sampler);
  const Source source = settings_.mode == SpeculativeMode::kDraftModel ? Source::kModel : Source::kNgram;
  propose_from(source, seq, history, std::min(k_, max_drafts), sampler);
  return proposal_.tokens;
}

std::span<const int32_t> RequestSpeculation::propose_auto(SequenceId seq, std::span<const int32_t> history,
                                                          int64_t max_drafts, int64_t batch_tokens,
                                                          int64_t remaining_tokens, Sampler& sampler) {
  check(context_.policy != nullptr && context_.policy->step_cost.measured(),
        "auto speculation runs with the engine's measured step cost");
  SpeculationPolicy& policy = *context_.policy;
  settle_shadow(history);
  const int64_t cap = std::min(settings_.draft_k, max_drafts);
  ngram_.propose(history, cap, sampler, shadow_);  // deterministic: draws nothing
  shadow_at_ = history.size();
  shadow_match_ = ngram_.last_match();
  DraftChoice lookup;
  if (shadow_match_ > 0) {
    const auto lookup_k = static_cast<int64_t>(shadow_.tokens.size());
    lookup = choose_draft_length(policy.step_cost, ngram_rate(shadow_match_).rate(), batch_tokens, lookup_k, 0,
                                 policy.min_draft_gain);
  }
  DraftChoice model;
  if (context_.draft != nullptr) {
    draft_rate_.set_prior(policy.draft_model_prior());
    const double acceptance = draft_rate_.rate();
    // A draft that fell behind (auto chose prompt lookup or nothing for a while) first catches up.
    const double catch_up = amortized_catch_up_seconds(
        static_cast<double>(context_.draft->catch_up_tokens(seq, history)) * policy.catch_up_seconds_per_token,
        acceptance, cap, remaining_tokens);
    model = choose_draft_length(policy.step_cost, acceptance, batch_tokens, cap, policy.draft_seconds_per_pass,
                                policy.min_draft_gain, catch_up);
  }
  if (model.k > 0 && model.gain > lookup.gain) {
    // The engine times the draft passes (policy.observe_draft_seconds).
    propose_from(Source::kModel, seq, history, model.k, sampler);
    return proposal_.tokens;  // the shadow stays: prompt lookup is judged on what this round yields
  }
  if (lookup.k == 0) return {};
  source_ = Source::kNgram;
  proposal_.tokens.assign(shadow_.tokens.begin(), shadow_.tokens.begin() + lookup.k);
  proposal_match_ = shadow_match_;
  shadow_.tokens.clear();  // judged by the verification itself
  return proposal_.tokens;
}

void RequestSpeculation::settle_shadow(std::span<const int32_t> history) {
  if (shadow_.tokens.empty() || history.size() <= shadow_at_) return;
  const std::span<const int32_t> next = history.subspan(shadow_at_);
  const size_t comparable = std::min(next.size(), shadow_.tokens.size());
  size_t matched = 0;
  while (matched < comparable && next[matched] == shadow_.tokens[matched]) matched++;
  // A mismatch is a rejection; a run cut short by the end of what came next is not.
  const size_t proposed = matched < comparable ? matched + 1 : matched;
  ngram_rate(shadow_match_).observe(static_cast<int64_t>(proposed), static_cast<int64_t>(matched));
  shadow_.tokens.clear();
}

void RequestSpeculation::keep_first(int64_t n) {
  check(proposal_.deterministic() && n >= 0 && n <= static_cast<int64_t>(proposal_.tokens.size()),
        "only a deterministic proposal is cut, and only shorter");
  proposal_.tokens.resize(static_cast<size_t>(n));
}

int64_t RequestSpeculation::verify(std::span<const float> rows, int64_t n_draft, std::span<const int32_t> history,
                                   Sampler& sampler, VerifyScratch& scratch, std::vector<int32_t>& produced) {
  check(n_draft == static_cast<int64_t>(proposal_.tokens.size()) && !drafts_pending_,
        "the batch verifies the whole proposal, drafted");
  const int64_t accepted = verify_draft(rows, proposal_, history, sampler, scratch, produced);
  if (settings_.adaptive_k) k_ = adapt_draft_k(k_, n_draft, accepted, settings_.draft_k);
  if (settings_.mode == SpeculativeMode::kAuto) {
    if (source_ == Source::kNgram) {
      ngram_rate(proposal_match_).observe(n_draft, accepted);
    } else {
      draft_rate_.observe(n_draft, accepted);
      context_.policy->draft_model_acceptance.observe(n_draft, accepted);
    }
  }
  return accepted;
}

}  // namespace kvserve
