// kvserve bench mode: not implemented yet.
#include "apps/bench.h"
#include "core/error.h"

namespace kvserve::cli {

int run_spec_bench(const BenchOptions&) { throw Error("this bench mode is not implemented yet"); }

}  // namespace kvserve::cli
