#include "engine/speculative.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/common_prefix.h"

namespace kvserve {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A draw from normalize(max(0, p - q)), where q is the draft row or, when
// deterministic, one-hot on `rejected`. When p - q has no positive mass (p == q
// up to rounding, so the rejection was all but impossible) p itself is drawn.
int32_t draw_residual(std::span<const float> p, std::span<const float> q, int32_t rejected, Sampler& sampler,
                      std::vector<float>& residual) {
  residual.resize(p.size());
  double mass = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    const float draft = q.empty() ? (static_cast<int32_t>(t) == rejected ? 1.0f : 0.0f) : q[t];
    residual[t] = std::max(0.0f, p[t] - draft);
    mass += residual[t];
  }
  if (mass <= 0) return draw_token(p, sampler);
  for (float& v : residual) v = static_cast<float>(v / mass);
  return draw_token(residual, sampler);
}

// The target's processed distribution for `row`, given scratch.context.
void target_distribution(std::span<const float> row, Sampler& sampler, VerifyScratch& s) {
  s.logits.assign(row.begin(), row.end());
  sampler.distribution(s.logits, s.context, s.probs);
}

// Greedy verification: the target's p is one-hot at its greedy choice, so a
// draft is accepted exactly when it is that token (p / q >= 1 for any q that
// proposed it), and a rejection's residual max(0, p - q) is that token too.
// Same tokens as the general walk, without building a distribution per row.
int64_t verify_greedy(std::span<const float> target_rows, const DraftProposal& proposal, size_t vocab,
                      Sampler& sampler, VerifyScratch& s, std::vector<int32_t>& produced) {
  const size_t drafts = proposal.tokens.size();
  const auto choice = [&](size_t row) {
    return sampler.greedy_choice(target_rows.subspan(row * vocab, vocab), s.context, s.logits);
  };
  for (size_t i = 0; i < drafts; ++i) {
    produced.push_back(choice(i));
    if (produced.back() != proposal.tokens[i]) return static_cast<int64_t>(i);
    s.context.push_back(produced.back());
  }
  produced.push_back(choice(drafts));  // the bonus token
  return static_cast<int64_t>(drafts);
}

}  // namespace

int64_t adapt_draft_k(int64_t k, int64_t proposed, int64_t accepted, int64_t max_k) {
  if (proposed == 0) return k;
  if (accepted == proposed) return std::min(k + 1, max_k);
  if (2 * accepted < proposed) return std::max<int64_t>(k - 1, 1);
  return k;
}

int32_t draw_token(std::span<const float> probs, Sampler& sampler) {
  if (sampler.params().temperature == 0.0f) return argmax(probs);
  const double u = sampler.next_uniform();
  double cumulative = 0;
  int32_t last_possible = -1;
  for (size_t t = 0; t < probs.size(); ++t) {
    if (probs[t] <= 0) continue;
    cumulative += probs[t];
    last_possible = static_cast<int32_t>(t);
    if (u < cumulative) return last_possible;
  }
  if (last_possible < 0) throw Error("draw_token: the distribution has no token with positive probability");
  return last_possible;  // rounding left the total a hair under 1
}

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

int64_t verify_draft(std::span<const float> target_rows, const DraftProposal& proposal,
                     std::span<const int32_t> history, Sampler& sampler, VerifyScratch& scratch,
                     std::vector<int32_t>& produced) {
  const size_t drafts = proposal.tokens.size();
  const size_t vocab = target_rows.size() / (drafts + 1);
  if (!proposal.deterministic() && proposal.probs.size() != drafts * vocab)
    throw Error("the draft's distributions have " +
                std::to_string(proposal.probs.size() / std::max<size_t>(drafts, 1)) +
                " entries per token but the target's vocabulary has " + std::to_string(vocab) +
                ": the draft and target vocabularies must match");
  produced.clear();
  scratch.context.assign(history.begin(), history.end());
  if (sampler.params().temperature == 0.0f) return verify_greedy(target_rows, proposal, vocab, sampler, scratch, produced);
  for (size_t i = 0; i < drafts; ++i) {
    target_distribution(target_rows.subspan(i * vocab, vocab), sampler, scratch);
    const int32_t token = proposal.tokens[i];
    const std::span<const float> q = proposal.deterministic()
                                         ? std::span<const float>()
                                         : std::span<const float>(proposal.probs).subspan(i * vocab, vocab);
    const double p_token = scratch.probs[static_cast<size_t>(token)];
    const double q_token = q.empty() ? 1.0 : q[static_cast<size_t>(token)];
    const double ratio = q_token > 0 ? p_token / q_token : 0.0;
    // Greedy only ever sees ratios of 0 or 1, so it never draws.
    const bool accept = ratio >= 1.0 || (ratio > 0.0 && sampler.next_uniform() < ratio);
    if (!accept) {
      produced.push_back(draw_residual(scratch.probs, q, token, sampler, scratch.residual));
      return static_cast<int64_t>(i);
    }
    produced.push_back(token);
    scratch.context.push_back(token);
  }
  target_distribution(target_rows.subspan(drafts * vocab, vocab), sampler, scratch);
  produced.push_back(draw_token(scratch.probs, sampler));  // the bonus token
  return static_cast<int64_t>(drafts);
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
