#pragma once
// A constraint on what a sequence may generate (a JSON schema, a regex, a
// grammar), as the engine sees it: a compiled, immutable constraint shared by
// every request that asks for the same thing, and one matcher per sequence
// that follows the tokens generated so far and says which may come next.
// The engine masks the logits with it before sampling (docs/structured_output.md).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kvserve {

// Not thread-safe: one per sequence, used by the engine thread.
class TokenMatcher {
 public:
  virtual ~TokenMatcher() = default;
  // Sets the logits of the tokens the constraint forbids next to -inf.
  // logits.size() is the vocabulary size.
  virtual void mask(std::span<float> logits) = 0;
  // Advances past `token`; false (and no change) when the constraint forbids it.
  virtual bool accept(int32_t token) = 0;
  // Undoes the last n accepted tokens (n <= the tokens accepted so far).
  virtual void rollback(int32_t n) = 0;
  // The output is complete and nothing but an end-of-generation token may
  // follow: the sequence ends here with finish_reason "stop".
  virtual bool finished() = 0;
};

// Immutable and thread-safe: shared by requests (and cached by content).
class CompiledConstraint {
 public:
  virtual ~CompiledConstraint() = default;
  // A matcher at the start of the output.
  virtual std::unique_ptr<TokenMatcher> new_matcher() const = 0;
  // Its memory, estimated, for the compiler cache's byte bound.
  virtual size_t memory_bytes() const { return sizeof(*this); }
};

}  // namespace kvserve
