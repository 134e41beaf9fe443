#pragma once
// Logits processing and next-token sampling: the per-request sampler chain
// (in the manner of llama.cpp's sampler chain and vLLM's SamplingParams).
//
// Order of the chain:
//   penalties -> (greedy short-circuit) -> temperature -> top-k -> softmax
//   -> top-p -> min-p -> renormalize -> draw with the seeded RNG.
#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace kvserve {

struct SamplingParams {
  // 0 means greedy (argmax, ties -> lowest id); negative or non-finite is an error.
  float temperature = 0.8f;
  // Keep the k most likely tokens. Any value <= 0 disables it (llama.cpp uses
  // 0 and vLLM -1 for "off", so both are accepted rather than rejected).
  int32_t top_k = 40;
  // Keep the smallest most-likely set whose probability reaches top_p.
  // Must be in (0, 1]; 1 disables.
  float top_p = 0.95f;
  // Keep tokens with p >= min_p * p_max. Must be in [0, 1]; 0 disables.
  float min_p = 0.05f;
  // llama.cpp / CTRL style: logit > 0 ? logit / pen : logit * pen for every
  // token in the penalty window. Must be > 0; 1 disables.
  float repetition_penalty = 1.0f;
  // The penalty window, shared by all three penalties: the last
  // repeat_last_n ids of the history. 0 disables penalties, -1 means the whole
  // history; anything below -1 is an error.
  int32_t repeat_last_n = 64;
  // OpenAI semantics over the window:
  //   logit -= count * frequency_penalty + (count > 0) * presence_penalty.
  // As in llama.cpp the window may include prompt tokens (OpenAI and vLLM
  // count generated tokens only): history does not mark where the prompt ends.
  // Any finite value is accepted (OpenAI documents [-2, 2] but does not need it).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;

  // Throws kvserve::Error naming the first bad field, e.g.
  // "top_p must be in (0, 1], got 1.5".
  void validate() const;
};

// Index of the largest entry; ties go to the lowest index and NaN entries
// never win. Throws kvserve::Error if logits is empty.
int32_t argmax(std::span<const float> logits);

// Not thread-safe: one Sampler per request (it owns the request's RNG stream).
class Sampler {
 public:
  // Validates params (throws kvserve::Error).
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }

  // logits: one row of vocabulary scores, each finite or -inf (-inf masks a
  // token). Used as scratch: its contents afterwards are unspecified.
  // history: prompt + generated ids so far, each in [0, logits.size()).
  // Throws kvserve::Error on bad input or when every token is masked.
  // A non-greedy call consumes exactly one draw from the RNG; greedy none.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  // What sample() returns at temperature 0, without consuming `logits`: the
  // row is copied into `scratch` only when penalties change it. Throws as
  // sample() does. For greedy verification, which needs the choice, not the
  // distribution (a vocabulary-sized copy, fill and scan per draft).
  int32_t greedy_choice(std::span<const float> logits, std::span<const int32_t> history,
                        std::vector<float>& scratch);

  // The next-token distribution after every step of the chain (what sample()
  // draws from): probs is resized to logits.size(), sums to 1 and is zero
  // outside the kept set. Does not touch the RNG.
  void distribution(std::span<float> logits, std::span<const int32_t> history, std::vector<float>& probs);

  // log_softmax of the raw logits (for the API's logprobs); -inf stays -inf.
  // Throws kvserve::Error if logits is empty, holds NaN or +inf, or is all -inf.
  static void log_softmax(std::span<const float> logits, std::vector<float>& out);

  uint64_t next_random_u64() { return rng_.next_u64(); }
  double next_uniform() { return rng_.next_uniform(); }  // in [0, 1)

 private:
  struct Candidate {
    int32_t id;
    float value;  // a logit before softmax, a probability after it
  };

  // The chain's one ordering: more likely first, ties to the lower id, so
  // that every cut (top-k, top-p) is deterministic.
  static bool more_likely(const Candidate& a, const Candidate& b);

  // Runs the chain; leaves candidates_ holding the kept tokens with their
  // normalized probabilities.
  void run_chain(std::span<float> logits, std::span<const int32_t> history);
  // Whether apply_penalties would change anything for this history.
  bool penalizes(std::span<const int32_t> history) const;
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history);
  // Fills candidates_ with the unmasked tokens, or only the top_k best of them.
  void gather_candidates(std::span<const float> logits);
  void gather_top_k(std::span<const float> logits, size_t k);
  void softmax_with_temperature();
  void keep_min_p();
  void keep_top_p();
  void renormalize();

  SamplingParams params_;
  Xoshiro256 rng_;
  // Scratch kept across calls so that steady-state sampling does not allocate.
  std::vector<Candidate> candidates_;
  std::vector<int32_t> window_;
};

}  // namespace kvserve
