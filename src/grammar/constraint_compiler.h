#pragma once
// Compiles request constraints for the server, off the engine thread: each
// distinct specification is compiled once and cached by content (a server sees
// the same schema again and again); a compile runs on its own thread and the
// requester waits at most compile_timeout_seconds for it, so a pathological
// grammar costs its requester a 400, never another request's progress. A
// compile that timed out keeps running and lands in the cache.
//
// Thread-safe: compile() is called from the server's request threads.
#include <cstdint>
#include <memory>

#include "grammar/constraint_spec.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

struct ConstraintLimits {
  size_t max_spec_bytes = 256 * 1024;   // schema / regex / grammar text, or all choices together
  size_t max_choices = 16384;
  double compile_timeout_seconds = 10;  // the requester's wait; the compile itself is not interrupted
  int64_t max_compiling = 4;            // compiles in flight; more wait (within the timeout), then kBusy
  int64_t max_cached = 512;             // compiled constraints kept (oldest dropped first)
};

struct ConstraintCompilerStats {
  int64_t requests = 0;    // compile() calls
  int64_t cache_hits = 0;  // answered from the cache (or by a compile already running)
  int64_t compiles = 0;    // compiles finished (successful or not)
  int64_t timeouts = 0;    // requesters that stopped waiting
  double compile_seconds = 0;  // summed over compiles
};

class ConstraintCompiler {
 public:
  // vocab_size: the logits' width. threads: xgrammar's for one compile (0: 1).
  // A build without xgrammar constructs fine; compile() then throws kUnavailable.
  ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size, ConstraintLimits limits = {}, int threads = 0);
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  // The compiled constraint, from the cache when the same spec was compiled
  // before. Throws ConstraintError (see its reasons).
  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec);
  ConstraintCompilerStats stats() const;

 private:
  struct Shared;
  ConstraintLimits limits_;
  std::shared_ptr<Shared> shared_;  // also held by compiles still running
};

}  // namespace kvserve
