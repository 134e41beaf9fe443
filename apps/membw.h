#pragma once
// Memory read bandwidth of this machine, measured by streaming a buffer far
// larger than the last-level cache (the ceiling for memory-bound decoding).

namespace kvserve::cli {

// GB/s (1e9 bytes) read with `threads` threads; best of a few passes.
double measure_read_bandwidth_gbps(int threads);

}  // namespace kvserve::cli
