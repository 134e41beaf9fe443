#include "speculation/draft_verification.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {
namespace {

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

}  // namespace kvserve
