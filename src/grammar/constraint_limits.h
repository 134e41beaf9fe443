#pragma once
// What the constraint compiler accepts and how it spends its threads and
// memory (docs/reliability.md, "Grammar compiles"). The caps on a spec's
// numbers are checked before a compile starts (spec_limits.h), in the
// requester's thread: every spec that passes them compiles in bounded time
// and memory, so no compile slot is held for long.
#include <cstddef>
#include <cstdint>

namespace kvserve {

struct ConstraintLimits {
  size_t max_spec_bytes = 256 * 1024;   // schema / regex / grammar text, or all choices together
  size_t max_choices = 16384;
  // The numbers that drive a compiled grammar's size.
  int64_t max_string_length = 100000;    // JSON schema minLength / maxLength
  int64_t max_array_items = 100000;      // minItems / maxItems / minContains / maxContains
  int64_t max_object_properties = 1000;  // minProperties / maxProperties
  int64_t max_schema_properties = 5000;  // properties of all the schema's objects together (OpenAI's cap)
  int64_t max_repetition = 256;          // one count {n} / {n,m} of a regex, schema pattern or grammar
  // What all the spec's counted repetitions unroll to, nested counts
  // multiplied: (.{16}){15} is 16 * 15 + 15 positions. xgrammar computes
  // token masks per position: 256 of `.` in a JSON string pattern is the
  // slowest compile these caps accept (docs/reliability.md).
  int64_t max_repeated_positions = 256;
  int64_t max_nesting = 32;              // schema levels; groups of a regex or grammar
  // Compile threads and the requester's wait.
  double compile_timeout_seconds = 10;  // the requester's wait; the compile itself is not interrupted
  int64_t max_compiling = 4;            // compiles in flight younger than the timeout; more wait, then kBusy
  int64_t max_overdue = 4;              // compiles past the timeout still running; more: kBusy until one ends
  // The cache of compiled constraints, by estimated bytes (oldest unused first).
  size_t max_cache_bytes = size_t{512} << 20;
  int64_t max_cached = 512;             // and by entries
};

}  // namespace kvserve
