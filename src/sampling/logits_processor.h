#pragma once
// The logits processors of one sequence: what changes a row of next-token
// logits before the sampler sees it (OpenAI's logit_bias, min_tokens, an
// output constraint). A chain is built per sequence when its request is
// admitted and applied in place, to the row the sampler then draws from, so
// the sampled token and the reported logprobs see the same adjusted
// distribution.
//
// sampling/ knows the constraint only through grammar/token_constraint.h's
// TokenMatcher interface.
//
// Not thread-safe: one chain per sequence, used by the engine thread.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "grammar/token_constraint.h"

namespace kvserve {

class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Whether process() changes the row of the token that follows `generated`
  // generated tokens.
  virtual bool changes(int64_t generated) const = 0;
  // Adjusts that row (row.size() is the vocabulary size).
  virtual void process(std::span<float> row, int64_t generated) = 0;
};

// Adds each (token, bias) to the token's logit (-inf stays -inf).
class LogitBias : public LogitsProcessor {
 public:
  explicit LogitBias(std::vector<std::pair<int32_t, float>> bias) : bias_(std::move(bias)) {}
  bool changes(int64_t) const override { return true; }
  void process(std::span<float> row, int64_t generated) override;

 private:
  std::vector<std::pair<int32_t, float>> bias_;
};

// Masks `ending` (end-of-generation ids and stop token ids) while fewer than
// min_tokens tokens are generated: the sequence cannot end before.
class MinTokensMask : public LogitsProcessor {
 public:
  MinTokensMask(int64_t min_tokens, std::vector<int32_t> ending) : min_tokens_(min_tokens), ending_(std::move(ending)) {}
  bool changes(int64_t generated) const override { return generated < min_tokens_; }
  void process(std::span<float> row, int64_t generated) override;

 private:
  int64_t min_tokens_;
  std::vector<int32_t> ending_;
};

// The constraint's mask in the matcher's current state.
class ConstraintMask : public LogitsProcessor {
 public:
  explicit ConstraintMask(TokenMatcher& matcher) : matcher_(matcher) {}
  bool changes(int64_t) const override { return true; }
  void process(std::span<float> row, int64_t) override { matcher_.mask(row); }

 private:
  TokenMatcher& matcher_;
};

class LogitsProcessorChain {
 public:
  // Processors run in the order added.
  void add(std::unique_ptr<LogitsProcessor> processor) { processors_.push_back(std::move(processor)); }
  // Adds the constraint's mask; the matcher also steps through the drafts in process_rows().
  void add_constraint(TokenMatcher& matcher);

  // Whether the row after `generated` tokens needs processing.
  bool changes(int64_t generated) const;
  void process(std::span<float> row, int64_t generated);

  // The verification rows [drafts + 1][vocab] of a speculative round, the
  // first after `generated` tokens, each processed for its position (the
  // constraint in the state its drafts lead to; the matcher is back where
  // it was on return). Rows after a draft the constraint rejects stay
  // unprocessed: that draft has probability 0, so they are never used.
  void process_rows(std::span<float> rows, size_t vocab, std::span<const int32_t> drafts, int64_t generated);

 private:
  std::vector<std::unique_ptr<LogitsProcessor>> processors_;
  TokenMatcher* matcher_ = nullptr;  // the constraint's, when there is one
};

}  // namespace kvserve
