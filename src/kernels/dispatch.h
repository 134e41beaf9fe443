#pragma once
// Run-time choice of the kernel instruction set. The best path this CPU (and
// this build) supports is chosen on first use, unless the environment variable
// KVSERVE_ISA=scalar|avx2|avx512 forces one. Tests and benchmarks switch paths
// in-process with set_kernel_isa().
#include <optional>
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

// How matmuls over quantized weights treat activations.
//  kQ8 (default): activations rounded to 8 bits per block (llama.cpp's
//    scheme) for integer dot products, ~1e-2 relative error per matmul. With
//    the repacked kernels (kernels/repack.h) a row's result is the same
//    bits whatever the batch, chunk or thread count.
//  kF32: weights are dequantized in registers and multiplied with the f32
//    activations: exact up to float rounding, so greedy output matches an
//    independent f32/f64 implementation token for token (the reference tests).
enum class ActivationPrecision { kF32, kQ8 };
const char* activation_precision_name(ActivationPrecision p);
// Parses "f32" or "q8"; throws kvserve::Error otherwise.
ActivationPrecision parse_activation_precision(std::string_view name);
// The first call reads KVSERVE_ACTIVATIONS (f32 | q8); a
// ScopedActivationPrecision on the calling thread takes precedence.
ActivationPrecision activation_precision();
void set_activation_precision(ActivationPrecision p);

// Makes this thread's matmuls use `precision` until destroyed (no change when
// empty): a draft model runs with 8-bit activations while its target stays
// exact (a draft's rounding changes which tokens it proposes, never the
// output). Matmuls read the precision on the calling thread, before their
// OpenMP region, so the scope covers their worker threads too.
class ScopedActivationPrecision {
 public:
  explicit ScopedActivationPrecision(std::optional<ActivationPrecision> precision);
  ~ScopedActivationPrecision();
  ScopedActivationPrecision(const ScopedActivationPrecision&) = delete;
  ScopedActivationPrecision& operator=(const ScopedActivationPrecision&) = delete;

 private:
  bool active_ = false;
  std::optional<ActivationPrecision> previous_;
};

}  // namespace kvserve
