#pragma once
// Running a test body once per kernel ISA this CPU has.
#include "kernels/dispatch.h"

namespace kvserve::test_util {

// Runs fn once per available kernel ISA (scalar first), restoring the active one after.
template <typename Fn>
void for_each_isa(Fn&& fn) {
  const Isa saved = active_isa();
  for (Isa isa : available_isas()) {
    set_kernel_isa(isa);
    fn();
  }
  set_kernel_isa(saved);
}

}  // namespace kvserve::test_util
