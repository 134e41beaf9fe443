// kvserve bench mode: not implemented yet.
#include "apps/bench.h"
#include "core/error.h"

namespace kvserve::cli {

int run_serving_bench(const BenchOptions&) { throw Error("this bench mode is not implemented yet"); }

}  // namespace kvserve::cli
