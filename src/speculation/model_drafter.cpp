#include "speculation/model_drafter.h"

#include <algorithm>

#include "core/common_prefix.h"
#include "core/error.h"
#include "speculation/draft_verification.h"

namespace kvserve {

void check_same_vocabulary(const Model& target, const Model& draft) {
  const int64_t nt = target.config().vocab_size, nd = draft.config().vocab_size;
  if (nt != nd)
    throw Error("the draft model " + draft.file().path() + " has a vocabulary of " + std::to_string(nd) +
                " tokens but the target " + target.file().path() + " has " + std::to_string(nt) +
                ": speculative decoding needs the same tokenizer (pick a draft of the same model family)");
  if (&target.file() == &draft.file() || target.file().path() == draft.file().path()) return;
  const std::string key = "tokenizer.ggml.tokens";
  const auto& tt = target.file().get_string_array(key);
  const auto& td = draft.file().get_string_array(key);
  const size_t n = std::min(tt.size(), td.size());
  for (size_t i = 0; i < n; ++i)
    if (tt[i] != td[i])
      throw Error("the draft and target vocabularies differ at token " + std::to_string(i) + ": target '" +
                  std::string(tt[i]) + "', draft '" + std::string(td[i]) + "': speculative decoding needs the same tokenizer");
  if (tt.size() != td.size())
    throw Error("the draft tokenizer has " + std::to_string(td.size()) + " tokens but the target's has " +
                std::to_string(tt.size()) + ": speculative decoding needs the same tokenizer");
}

ModelDrafter::ModelDrafter(const Model& draft, int64_t max_context)
    : decoder_(make_decoder("cached", draft, max_context)) {}

std::span<const float> ModelDrafter::sync(std::span<const int32_t> history, size_t n) {
  const size_t keep = common_prefix(cached_, history.first(n));
  if (keep < cached_.size()) {
    decoder_->truncate(static_cast<int64_t>(keep));
    cached_.resize(keep);
  }
  if (keep == n) return {};
  const std::span<const int32_t> missing = history.subspan(keep, n - keep);
  cached_.insert(cached_.end(), missing.begin(), missing.end());
  return decoder_->append(missing);
}

void ModelDrafter::commit(std::span<const int32_t> history) {
  if (history.empty()) {
    decoder_->reset();
    cached_.clear();
    return;
  }
  sync(history, history.size() - 1);
}

void ModelDrafter::propose(std::span<const int32_t> history, int64_t k, Sampler& sampler, DraftProposal& out) {
  out.tokens.clear();
  out.probs.clear();
  // The decoder ends up holding history plus k - 1 drafts.
  k = std::min(k, decoder_->max_context() - static_cast<int64_t>(history.size()) + 1);
  if (k <= 0 || history.empty()) return;
  // Re-append the last token when the decoder already holds all of history:
  // its logits were not kept.
  if (cached_.size() >= history.size()) sync(history, history.size() - 1);
  std::span<const float> logits = sync(history, history.size());
  context_.assign(history.begin(), history.end());
  const size_t vocab = logits.size();
  out.probs.resize(static_cast<size_t>(k) * vocab);
  std::vector<float> row;
  for (int64_t i = 0; i < k; ++i) {
    logits_.assign(logits.begin(), logits.end());
    sampler.distribution(logits_, context_, row);
    std::copy(row.begin(), row.end(), out.probs.begin() + static_cast<std::ptrdiff_t>(i * vocab));
    const int32_t token = draw_token(row, sampler);
    out.tokens.push_back(token);
    context_.push_back(token);
    if (i + 1 < k) {
      cached_.push_back(token);
      logits = decoder_->append(std::span<const int32_t>(&token, 1));
    }
  }
}

}  // namespace kvserve
