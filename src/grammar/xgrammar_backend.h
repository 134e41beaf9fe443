#pragma once
// The one file that knows xgrammar: turns a ConstraintSpec into a compiled
// xgrammar grammar over the model's vocabulary, and runs its matcher as a
// TokenMatcher. Without xgrammar at build time (KVSERVE_HAVE_XGRAMMAR unset)
// every call throws ConstraintError kUnavailable.
#include <cstdint>
#include <memory>

#include "grammar/constraint_spec.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

// Whether this build has xgrammar.
bool xgrammar_available();

// The vocabulary as xgrammar sees it, built once per model (it indexes every
// token's bytes). Thread-safe once built: compile() may run on several threads.
class XGrammarBackend {
 public:
  // vocab_size: the logits' width (at least the tokenizer's). threads: for
  // xgrammar's per-grammar token-mask precomputation.
  XGrammarBackend(const Tokenizer& tokenizer, int32_t vocab_size, int threads);
  ~XGrammarBackend();
  XGrammarBackend(const XGrammarBackend&) = delete;
  XGrammarBackend& operator=(const XGrammarBackend&) = delete;

  // Throws ConstraintError (kInvalid with xgrammar's message) for a spec it
  // cannot compile.
  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvserve
