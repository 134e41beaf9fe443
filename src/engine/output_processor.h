#pragma once
// What a generated token adds to a sequence's event, and whether it ends the
// sequence: its logprobs (of the distribution it was sampled from, after the
// logits processors), the constraint's matcher stepping past it, its text
// (detokenized, stop strings held back and cut), and the finish reason it
// causes (end of generation, a stop string or stop token, a complete
// constraint, max_tokens, the context).
//
// Not thread-safe: the engine thread's, with buffers reused across tokens.
#include <cstdint>
#include <span>
#include <vector>

#include "decode/sequence.h"
#include "engine/engine.h"
#include "engine/finish_reason.h"
#include "engine/request_state.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

class OutputProcessor {
 public:
  explicit OutputProcessor(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // The log-softmax of the row a token is sampled from: take it before the
  // sampler changes the row (penalties work in place). Valid until the next call.
  std::span<const float> log_probs(std::span<const float> row);

  // Adds `token` to the event (the sequence now holds `length` tokens);
  // `log_probs` is log_probs() of its row when the request asks for logprobs.
  // Returns the finish reason it causes, kNone if the sequence goes on.
  FinishReason take_token(const Sequence& seq, const GenerationRequest& r, SequenceState& state, int32_t token,
                          int64_t length, std::span<const float> log_probs, GenerationEvent& ev);

  // A prompt token's entry: logprob_of() and its rank (1 + the ids more likely).
  TokenLogprob scored_token(std::span<const float> log_probs, int32_t id, int32_t top);

  // Generated tokens taken so far (those a constraint rejected excluded).
  int64_t tokens_taken() const { return tokens_taken_; }

 private:
  // The token's logprob and the `top` most likely (most likely first, ties to the lower id).
  TokenLogprob logprob_of(std::span<const float> log_probs, int32_t id, int32_t top);

  const Tokenizer& tokenizer_;
  int64_t tokens_taken_ = 0;
  std::vector<float> log_probs_;  // [vocab]
  std::vector<int32_t> top_;      // the top-k selection's heap
};

}  // namespace kvserve
