#pragma once
// Compiles request constraints for the server, off the engine thread: each
// distinct specification is compiled once and cached by content (a server sees
// the same schema again and again); a compile runs on its own thread and the
// requester waits at most compile_timeout_seconds for it, so a pathological
// grammar costs its requester a 400, never another request's progress. A
// compile that timed out keeps running and lands in the cache; xgrammar cannot
// be interrupted, so such a compile stops holding one of the max_compiling
// slots and holds one of max_overdue instead (docs/reliability.md, "Grammar
// compiles"). The cache is bounded in estimated bytes and entries.
//
// Thread-safe: compile() is called from the server's request threads.
#include <cstdint>
#include <functional>
#include <memory>

#include "grammar/constraint_limits.h"
#include "grammar/constraint_spec.h"
#include "grammar/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

struct ConstraintCompilerStats {
  int64_t requests = 0;    // compile() calls
  int64_t cache_hits = 0;  // answered from the cache (or by a compile already running)
  int64_t compiles = 0;    // compiles finished (successful or not)
  int64_t timeouts = 0;    // requesters that stopped waiting
  int64_t busy = 0;        // requesters refused for want of a compile slot
  double compile_seconds = 0;  // summed over compiles
  int64_t running = 0;     // compile threads now running (overdue ones included)
  int64_t cached = 0;      // entries in the cache (compiling ones included)
  size_t cached_bytes = 0; // their estimated size
};

class ConstraintCompiler {
 public:
  // vocab_size: the logits' width. threads: xgrammar's for one compile (0: 1).
  // A build without xgrammar constructs fine; compile() then throws kUnavailable.
  ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size, ConstraintLimits limits = {}, int threads = 0);
  // Compiles with `compile` instead of xgrammar (tests: compiles that take as long as they are told).
  using CompileFunction = std::function<std::shared_ptr<const CompiledConstraint>(const ConstraintSpec&)>;
  ConstraintCompiler(CompileFunction compile, ConstraintLimits limits);
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  // The compiled constraint, from the cache when the same spec was compiled
  // before. Throws ConstraintError (see its reasons).
  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec);
  ConstraintCompilerStats stats() const;
  const ConstraintLimits& limits() const { return limits_; }

 private:
  struct Shared;
  ConstraintLimits limits_;
  std::shared_ptr<Shared> shared_;  // also held by compiles still running
};

}  // namespace kvserve
