#include "engine/output_processor.h"

#include <algorithm>
#include <string>

#include "sampling/sampler.h"

namespace kvserve {

std::span<const float> OutputProcessor::log_probs(std::span<const float> row) {
  Sampler::log_softmax(row, log_probs_);
  return log_probs_;
}

TokenLogprob OutputProcessor::logprob_of(std::span<const float> log_probs, int32_t id, int32_t top) {
  TokenLogprob lp{id, log_probs[static_cast<size_t>(id)], {}};
  const auto k = std::min(static_cast<size_t>(std::max(top, 0)), log_probs.size());
  if (k == 0) return lp;
  const auto more_likely = [&](int32_t a, int32_t b) {
    const float pa = log_probs[static_cast<size_t>(a)], pb = log_probs[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  };
  // The k best so far in a heap with the least likely on top: one pass, most ids one comparison.
  top_.clear();
  for (int32_t i = 0; i < static_cast<int32_t>(log_probs.size()); ++i) {
    if (top_.size() < k) {
      top_.push_back(i);
      std::push_heap(top_.begin(), top_.end(), more_likely);
    } else if (more_likely(i, top_.front())) {
      std::pop_heap(top_.begin(), top_.end(), more_likely);
      top_.back() = i;
      std::push_heap(top_.begin(), top_.end(), more_likely);
    }
  }
  std::sort_heap(top_.begin(), top_.end(), more_likely);
  for (int32_t t : top_) lp.top.emplace_back(t, log_probs[static_cast<size_t>(t)]);
  return lp;
}

TokenLogprob OutputProcessor::scored_token(std::span<const float> log_probs, int32_t id, int32_t top) {
  TokenLogprob lp = logprob_of(log_probs, id, top);
  lp.rank = 1 + std::count_if(log_probs.begin(), log_probs.end(), [&](float v) { return v > lp.logprob; });
  return lp;
}

FinishReason OutputProcessor::take_token(const Sequence& seq, const GenerationRequest& r, SequenceState& state,
                                         int32_t token, int64_t length, std::span<const float> log_probs,
                                         GenerationEvent& ev) {
  state.completion_tokens++;
  ev.completion_tokens = state.completion_tokens;
  ev.tokens.push_back(token);
  if (r.top_logprobs >= 0) ev.logprobs.push_back(logprob_of(log_probs, token, r.top_logprobs));
  if (state.matcher && !state.matcher->accept(token)) {  // the mask allowed it: only a bug gets here
    ev.error = "the output constraint rejected token " + std::to_string(token);
    return FinishReason::kError;
  }
  const bool eog = !r.ignore_eos && tokenizer_.is_end_of_generation(token);
  ev.text += eog ? state.stops.flush() : state.stops.push(state.stream.push(token));
  tokens_taken_++;
  if (state.stops.stopped()) ev.stop_sequence = state.stops.matched();
  if (eog || state.stops.stopped()) return FinishReason::kStop;
  // A stop token (its text kept), or a complete constraint (only an end-of-generation token could follow).
  const bool stop_token = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) != r.stop_token_ids.end();
  if (stop_token || (state.matcher && state.matcher->finished())) {
    ev.text += state.stops.push(state.stream.flush()) + state.stops.flush();
    return FinishReason::kStop;
  }
  // The last sampled token needs no K/V slot: a sequence may hold context + 1 tokens.
  if (state.completion_tokens >= r.max_tokens || length > seq.max_kv_tokens) {
    ev.text += state.stops.push(state.stream.flush()) + state.stops.flush();
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

}  // namespace kvserve
