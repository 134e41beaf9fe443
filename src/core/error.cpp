#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace kvserve {

void invariant_failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "kvserve: internal invariant broken at %s:%d: %s\n", file, line, what);
  std::abort();
}

}  // namespace kvserve
