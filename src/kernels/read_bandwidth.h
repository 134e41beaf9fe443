#pragma once
// Memory read bandwidth: the ceiling for memory-bound decoding (tokens/s can
// never exceed bandwidth / bytes read per token). One probe shared by
// `kvserve bench --membw` and microbench/kernels.
#include <cstddef>
#include <cstdint>

namespace kvserve {

// Sum of the buffer's 64-bit words (n rounded down to 128 bytes with AVX2,
// to 8 bytes otherwise); the result only keeps the reads from being elided.
uint64_t sum_bytes(const uint8_t* data, size_t n);

// GB/s (1e9 bytes) reading `bytes` of `data` with `threads` threads. The
// buffer is read in 64 MiB slices, each split among the threads and timed on
// its own; the best slice counts, so brief outside load on a shared host
// biases the figure less. `bytes` should be several times the last-level
// cache; at least one slice is read.
double read_bandwidth_gbps(const uint8_t* data, size_t bytes, int threads);

}  // namespace kvserve
