#include "kernels/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/cpu_features.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace {

const KernelTable& table_for(Isa isa) {
  switch (isa) {
#if KVSERVE_HAVE_SIMD
    case Isa::Avx512: return avx512_kernel_table();
    case Isa::Avx2: return avx2_kernel_table();
#endif
    default: return scalar_kernel_table();
  }
}

// The one-time dispatch table: chosen on first use, switched only by
// set_kernel_isa(). Atomic so that a switch is at least well-defined.
std::atomic<const KernelTable*>& active_table_slot() {
  static std::atomic<const KernelTable*> slot{&table_for(isa_from_setting(std::getenv("KVSERVE_ISA")))};
  return slot;
}

thread_local std::optional<ActivationPrecision> thread_precision;

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "unknown";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (name == isa_name(isa)) return isa;
  throw Error("unknown kernel ISA '" + std::string(name) + "' (expected scalar, avx2 or avx512)");
}

bool isa_available(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar: return true;
#if KVSERVE_HAVE_SIMD
    case Isa::Avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::Avx512:
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
#endif
    default: (void)f; return false;
  }
}

std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (isa_available(isa)) isas.push_back(isa);
  return isas;
}

Isa best_isa() { return available_isas().back(); }

Isa isa_from_setting(const char* setting) {
  if (!setting || !*setting) return best_isa();
  const Isa isa = parse_isa(setting);
  if (!isa_available(isa))
    throw Error(std::string("KVSERVE_ISA=") + setting + ": this CPU or build cannot run that kernel path");
  return isa;
}

Isa active_isa() { return active_kernel_table().isa; }

void set_kernel_isa(Isa isa) {
  if (!isa_available(isa))
    throw Error(std::string("kernel ISA ") + isa_name(isa) + " is not available on this CPU or build");
  active_table_slot().store(&table_for(isa), std::memory_order_release);
}

namespace {

std::atomic<ActivationPrecision>& precision_slot() {
  static std::atomic<ActivationPrecision> slot{[] {
    const char* env = std::getenv("KVSERVE_ACTIVATIONS");
    return env && *env ? parse_activation_precision(env) : ActivationPrecision::kQ8;
  }()};
  return slot;
}

}  // namespace

const char* activation_precision_name(ActivationPrecision p) { return p == ActivationPrecision::kF32 ? "f32" : "q8"; }

ActivationPrecision parse_activation_precision(std::string_view name) {
  if (name == "f32") return ActivationPrecision::kF32;
  if (name == "q8") return ActivationPrecision::kQ8;
  throw Error("unknown activation precision '" + std::string(name) + "' (expected f32 or q8)");
}

ActivationPrecision activation_precision() {
  return thread_precision ? *thread_precision : precision_slot().load(std::memory_order_relaxed);
}

ScopedActivationPrecision::ScopedActivationPrecision(std::optional<ActivationPrecision> precision)
    : active_(precision.has_value()), previous_(thread_precision) {
  if (active_) thread_precision = precision;
}

ScopedActivationPrecision::~ScopedActivationPrecision() {
  if (active_) thread_precision = previous_;
}

void set_activation_precision(ActivationPrecision p) { precision_slot().store(p, std::memory_order_relaxed); }

const KernelTable& active_kernel_table() { return *active_table_slot().load(std::memory_order_acquire); }

}  // namespace kvserve
