#pragma once
// Errors in three tiers (see docs/architecture.md):
//  - "does not fit" is a value (std::optional / bool) at the call site;
//  - bad input at a boundary (files, requests, flags) throws kvserve::Error
//    with a message a user can act on;
//  - a broken internal invariant calls check(), which aborts with its text.
#include <stdexcept>
#include <string>

namespace kvserve {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Aborts the process: for invariants that only a bug can break.
[[noreturn]] void invariant_failed(const char* what, const char* file, int line);

inline void check(bool condition, const char* what,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (!condition) invariant_failed(what, file, line);
}

}  // namespace kvserve
