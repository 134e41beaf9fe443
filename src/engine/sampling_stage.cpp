#include "engine/sampling_stage.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

SamplingStage::SamplingStage(RequestTable& requests, Scheduler& scheduler, const Tokenizer& tokenizer,
                             int64_t vocab_size, EngineMetrics& counters)
    : requests_(requests), scheduler_(scheduler), vocab_(static_cast<size_t>(vocab_size)), counters_(counters),
      output_(tokenizer) {}

void SamplingStage::run(const SchedulerOutput& out, std::span<float> logits, std::span<const int64_t> first_row) {
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    const auto first = static_cast<size_t>(first_row[i]), end = static_cast<size_t>(first_row[i + 1]);
    if (first == end) continue;
    const auto owner = requests_.owner(*c.seq);
    const RequestId id = owner.id;
    if (requests_.failed(id)) continue;  // another sequence of it failed: it ends after the step
    requests_.for_request(id, [&] {
      if (c.seq->scores_rows(c.start, c.n))
        score_prompt(owner.request, *c.seq, c.start, logits.subspan(first * vocab_, (end - first) * vocab_));
      if (!c.samples) return;
      const auto rows = static_cast<size_t>(c.n_draft + 1);  // the chunk's last rows
      const auto span = logits.subspan((end - rows) * vocab_, rows * vocab_);
      if (c.n_draft > 0) on_draft_logits(*c.seq, c.n_draft, span);
      else on_logits(*c.seq, span);
    });
  }
}

// Row r of `rows` is the logits after prompt token start + r: the logprob of
// token start + r + 1 (and the most likely ones), taken once per position.
void SamplingStage::score_prompt(RequestState& rs, Sequence& seq, int64_t start, std::span<const float> rows) {
  const int64_t n_rows = static_cast<int64_t>(rows.size() / vocab_);
  for (int64_t p = std::max(start, seq.prompt_rows_scored); p < start + n_rows && p < seq.prompt_len - 1; ++p) {
    const auto row = rows.subspan(static_cast<size_t>(p - start) * vocab_, vocab_);
    const int32_t token = seq.tokens[static_cast<size_t>(p + 1)];
    rs.prompt_logprobs.push_back(output_.scored_token(output_.log_probs(row), token, rs.request.prompt_logprobs));
    seq.prompt_rows_scored = p + 1;
  }
}

// Samples the next token of `seq` from its row of logits and streams it.
// The first logits of a request with n > 1 fork its sequence 0 into the
// others, and every sequence samples its first token from them.
void SamplingStage::on_logits(Sequence& seq, std::span<float> row) {
  const auto [id, rs, state] = requests_.owner(seq);
  if (rs.forked || rs.request.n == 1) return sample(id, rs, state, seq, row);
  const auto all = requests_.fork(id, seq);
  // Sampling changes its row: every sequence but the last samples from a copy.
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    fork_row_.assign(row.begin(), row.end());
    sample(id, rs, *all[i].first, *all[i].second, fork_row_);
  }
  sample(id, rs, *all.back().first, *all.back().second, row);  // the last sequence to finish erases rs
}

// The sequence's next token from `row`, processed and sampled in place: the
// adjusted distribution is sampled from and reported in logprobs (taken
// before the sampler's penalties change the row).
void SamplingStage::sample(RequestId id, RequestState& rs, SequenceState& state, Sequence& seq,
                           std::span<float> row) {
  if (state.completion_tokens == 0) rs.cached_tokens = seq.prefix_hit_tokens;
  if (rs.request.max_tokens == 0) {  // only the prompt's logprobs were asked for: its prefill was the work
    GenerationEvent ev = requests_.event(id, state);
    ev.prompt_logprobs = rs.prompt_logprobs;
    return requests_.finish(id, state, ev, FinishReason::kLength);
  }
  if (state.logits.changes(state.completion_tokens)) state.logits.process(row, state.completion_tokens);
  std::span<const float> log_probs;
  int32_t token = 0;
  try {
    if (rs.request.top_logprobs >= 0) log_probs = output_.log_probs(row);
    token = state.sampler.sample(row, seq.tokens);
  } catch (const Error& e) {  // e.g. a constraint that no token can continue: this sequence alone fails
    return requests_.finish_if_live(id, state, FinishReason::kError, e.what());
  }
  seq.tokens.push_back(token);
  GenerationEvent ev = requests_.event(id, state);
  if (state.completion_tokens == 0) ev.prompt_logprobs = rs.prompt_logprobs;  // each sequence's first event
  const FinishReason reason = output_.take_token(seq, rs.request, state, token, seq.num_tokens(), log_probs, ev);
  if (reason != FinishReason::kNone) return requests_.finish(id, state, ev, reason);
  rs.on_event(ev);
}

// Verifies the drafts of a speculative chunk against its rows
// [n_draft + 1][vocab] (processed in place, each for its position), rolls
// the rejected ones back and streams the round's tokens, stopping at the
// first that ends the sequence.
void SamplingStage::on_draft_logits(Sequence& seq, int64_t n_draft, std::span<float> rows) {
  const auto [id, rs, state] = requests_.owner(seq);
  const int64_t base = seq.num_tokens() - n_draft;  // the history the drafts follow
  const auto history = std::span<const int32_t>(seq.tokens).first(static_cast<size_t>(base));
  if (state.logits.changes(state.completion_tokens))
    state.logits.process_rows(rows, vocab_, std::span<const int32_t>(seq.tokens).subspan(static_cast<size_t>(base)),
                              state.completion_tokens);
  const int64_t accepted = state.spec.verify(rows, n_draft, history, state.sampler, verify_scratch_, produced_);
  counters_.spec_rounds++;
  counters_.spec_draft_tokens += n_draft;
  counters_.spec_accepted_tokens += accepted;
  scheduler_.resolve_drafts(seq, accepted);
  seq.tokens.push_back(produced_.back());  // the accepted drafts are already there
  GenerationEvent ev = requests_.event(id, state);
  for (size_t i = 0; i < produced_.size(); ++i) {
    const auto row = rows.subspan(i * vocab_, vocab_);
    const auto log_probs = rs.request.top_logprobs >= 0 ? output_.log_probs(row) : std::span<const float>{};
    const int64_t length = base + static_cast<int64_t>(i) + 1;
    const FinishReason reason = output_.take_token(seq, rs.request, state, produced_[i], length, log_probs, ev);
    if (reason != FinishReason::kNone) return requests_.finish(id, state, ev, reason);
  }
  rs.on_event(ev);
}

}  // namespace kvserve
