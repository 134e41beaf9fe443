#include "kernels/openmp_wait.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace kvserve {
namespace {

// Busy and total jiffies of all CPUs from /proc/stat's first line; false
// when unreadable.
bool read_cpu_jiffies(unsigned long long& busy, unsigned long long& total) {
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return false;
  unsigned long long v[8] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                            &v[5], &v[6], &v[7]);
  std::fclose(f);
  if (n < 5) return false;
  total = 0;
  for (unsigned long long x : v) total += x;
  busy = total - v[3] - v[4];  // minus idle and iowait
  return true;
}

}  // namespace

double busy_cpu_share(int milliseconds) {
  unsigned long long b0 = 0, t0 = 0, b1 = 0, t1 = 0;
  if (!read_cpu_jiffies(b0, t0)) return -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
  if (!read_cpu_jiffies(b1, t1) || t1 <= t0) return -1;
  return static_cast<double>(b1 - b0) / static_cast<double>(t1 - t0);
}

void reexec_with_passive_openmp_wait(char** argv) {
  // Either variable set means the user chose a wait policy; the re-executed
  // process also lands here, sees OMP_WAIT_POLICY and runs on.
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  // On an idle machine spinning is right: passive waits cost ~40% of decode
  // speed (a futex wake per parallel region). Only when other processes
  // already keep the CPUs busy does spinning starve the threads it waits for.
  if (busy_cpu_share(50) < kBusyShareForPassiveWait) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the exec failed (no /proc, say); run with the defaults.
  unsetenv("OMP_WAIT_POLICY");
}

void release_this_threads_openmp_pool() {
#ifdef _LIBGOMP_OMP_LOCK_DEFINED
  // libgomp pauses only the calling thread's pool (gomp_pause_host); LLVM's
  // libomp would pause the whole runtime, the engine thread's team included.
  omp_pause_resource_all(omp_pause_soft);
#endif
}

}  // namespace kvserve
