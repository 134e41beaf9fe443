#include "kernels/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace kvserve {

void reexec_with_passive_openmp_wait(char** argv) {
  // Either variable set means the user chose a wait policy; the re-executed
  // process also lands here, sees OMP_WAIT_POLICY and runs on.
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the exec failed (no /proc, say); run with the defaults.
  unsetenv("OMP_WAIT_POLICY");
}

}  // namespace kvserve
