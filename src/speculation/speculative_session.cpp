#include "speculation/speculative_session.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "speculation/draft_verification.h"

namespace kvserve {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

SpeculativeSession::SpeculativeSession(Decoder& target, Drafter& drafter, Sampler& sampler)
    : target_(target), drafter_(drafter), sampler_(sampler) {}

void SpeculativeSession::start(std::span<const int32_t> prompt) {
  if (prompt.empty()) throw Error("the prompt is empty (no tokens to start from)");
  if (static_cast<int64_t>(prompt.size()) > target_.max_context())
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context size of " +
                std::to_string(target_.max_context()));
  target_.reset();
  history_.assign(prompt.begin(), prompt.end());
  stats_ = {};
  if (prompt.size() > 1) target_.append(prompt.first(prompt.size() - 1));
  drafter_.commit({});
  drafter_.commit(history_);
}

std::span<const int32_t> SpeculativeSession::step(int64_t k) {
  if (room() <= 0)
    throw Error("speculative step: the context of " + std::to_string(target_.max_context()) + " tokens is full");
  k = std::clamp<int64_t>(k, 0, room() - 1);
  proposal_.tokens.clear();
  proposal_.probs.clear();
  if (k > 0) drafter_.propose(history_, k, sampler_, proposal_);
  if (static_cast<int64_t>(proposal_.tokens.size()) > k)
    throw Error(std::string("drafter ") + drafter_.name() + " proposed more tokens than asked for");
  batch_.assign(1, history_.back());
  batch_.insert(batch_.end(), proposal_.tokens.begin(), proposal_.tokens.end());
  const int64_t base = target_.length();
  const std::span<const float> rows = target_.append_all(batch_);
  const int64_t accepted = verify_draft(rows, proposal_, history_, sampler_, scratch_, produced_);
  // Roll back the rejected drafts: keep history up to, not including, the new last token.
  target_.truncate(base + 1 + accepted);
  history_.insert(history_.end(), produced_.begin(), produced_.end());
  drafter_.commit(history_);
  stats_.target_passes += 1;
  stats_.proposed += static_cast<int64_t>(proposal_.tokens.size());
  stats_.accepted += accepted;
  stats_.generated += static_cast<int64_t>(produced_.size());
  return produced_;
}

SpeculativeResult generate_speculative(Decoder& target, Drafter& drafter, Sampler& sampler,
                                       const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                       const SpeculativeOptions& options,
                                       const std::function<bool(int32_t)>& on_token) {
  if (options.draft_k < 0) throw Error("--draft-k must be >= 0, got " + std::to_string(options.draft_k));
  SpeculativeResult result;
  GenerateResult& gen = result.generation;
  gen.prompt_tokens = static_cast<int64_t>(prompt.size());
  SpeculativeSession session(target, drafter, sampler);
  auto t0 = std::chrono::steady_clock::now();
  session.start(prompt);
  gen.prompt_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  gen.finish_reason = "length";
  const int64_t budget = std::min(options.max_new_tokens, session.room());
  int64_t k = options.draft_k;
  bool done = budget <= 0;
  while (!done) {
    const int64_t left = budget - static_cast<int64_t>(gen.tokens.size());
    const SpeculativeStats before = session.stats();
    // Drafting past the budget would be wasted work.
    const std::span<const int32_t> produced = session.step(std::min(k, left - 1));
    for (const int32_t id : produced) {
      gen.tokens.push_back(id);
      const bool keep_going = on_token(id);
      if ((options.stop_at_end_of_generation && tokenizer.is_end_of_generation(id)) || !keep_going) {
        gen.finish_reason = "stop";
        done = true;
        break;
      }
      if (static_cast<int64_t>(gen.tokens.size()) == budget) {
        done = true;
        break;
      }
    }
    if (options.adaptive_k)
      k = adapt_draft_k(k, session.stats().proposed - before.proposed, session.stats().accepted - before.accepted,
                        options.draft_k);
  }
  gen.generate_seconds = seconds_since(t0);
  result.stats = session.stats();
  return result;
}

}  // namespace kvserve
