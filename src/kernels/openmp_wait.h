#pragma once
// How idle OpenMP threads wait between parallel regions.
//
// libgomp's default is to spin ~300k iterations at every barrier before
// sleeping. A decode step has ~120 parallel regions; when another process
// holds one of the cores, the spinning thread burns the slice the descheduled
// thread needs, and 2 threads on a loaded 2-core host fell to ~2 tokens/s
// (25 with OMP_WAIT_POLICY=passive). libgomp reads OMP_WAIT_POLICY and
// GOMP_SPINCOUNT once, in a constructor that runs when the library is loaded,
// i.e. before main(), so setenv() in main() is too late.

namespace kvserve {

// Share of all CPUs' time spent busy over the next `milliseconds` (from
// /proc/stat), or -1 when it cannot be read.
double busy_cpu_share(int milliseconds);

// Above this share of busy CPU time at start-up (other processes: we are idle
// then), threads wait passively.
constexpr double kBusyShareForPassiveWait = 0.3;

// Unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, and only when the
// machine is already busy at start-up (measured over 50 ms), sets
// OMP_WAIT_POLICY=passive and re-executes this program (/proc/self/exe, same
// argv) so libgomp starts with it. Call first thing in main(). Returns normally
// when nothing needs doing or the re-exec fails (the program then runs with
// libgomp's defaults). Measured: idle host, passive costs ~40% of tg speed
// (122 -> 70 t/s, q4_1); loaded host, spinning costs ~85% (55 -> 9 t/s, q8_0).
void reexec_with_passive_openmp_wait(char** argv);

// Releases the idle OpenMP worker threads of the calling thread's own pool
// (libgomp; a no-op with other runtimes). libgomp keeps a pool per thread that
// ever opened a parallel region, and while it manages more threads than there
// are CPUs it spins only 100 iterations at a barrier before sleeping on a
// futex, which is the passive wait above without anyone having asked for it.
// The engine's own thread runs the forward passes; the thread that loaded the
// model (repacking in parallel) and built the engine calls this once it hands
// the work over. Measured (Zen 4, 2 CPUs, SmolLM2, `run -f`, 8 prompts):
// 173 -> 255 tokens/s at one sequence, 342 -> 521 at four.
void release_this_threads_openmp_pool();

}  // namespace kvserve
