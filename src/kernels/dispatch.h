#pragma once
// Run-time choice of the kernel instruction set. The best path this CPU (and
// this build) supports is chosen on first use, unless the environment variable
// KVSERVE_ISA=scalar|avx2|avx512 forces one. Tests and benchmarks switch paths
// in-process with set_kernel_isa().
#include <string_view>
#include <vector>

namespace kvserve {

enum class Isa { Scalar, Avx2, Avx512 };

const char* isa_name(Isa isa);
// Parses "scalar", "avx2", "avx512"; throws kvserve::Error otherwise.
Isa parse_isa(std::string_view name);

// Whether this build has the path and this CPU can run it.
bool isa_available(Isa isa);
// Every available path, slowest first (always starts with Isa::Scalar).
std::vector<Isa> available_isas();
// The fastest available path.
Isa best_isa();

// The path a KVSERVE_ISA value selects: best_isa() for nullptr or "", else
// the named path; throws kvserve::Error for an unknown or unavailable one.
Isa isa_from_setting(const char* setting);

// The path matmul() uses now. The first call reads KVSERVE_ISA and throws
// kvserve::Error if it names an unknown or unavailable path.
Isa active_isa();
// Switches every later matmul() to `isa`; throws kvserve::Error if it is not
// available. Not meant to race with running kernels (tests, benchmarks).
void set_kernel_isa(Isa isa);

}  // namespace kvserve
