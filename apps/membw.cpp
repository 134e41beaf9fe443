#include "apps/membw.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "core/aligned_buffer.h"

namespace kvserve::cli {
namespace {

// Sums 64-bit lanes with AVX2 loads so that the core issues reads as fast
// as the memory system takes them (a scalar loop underestimates).
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_scalar(const uint64_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

}  // namespace

double measure_read_bandwidth_gbps(int threads) {
  // 1 GiB: several times the 260 MB L3 of the target machine.
  constexpr size_t kBytes = size_t{1} << 30;
  AlignedBuffer<uint64_t> buffer(kBytes / 8);
  const size_t n = buffer.size();
  for (size_t i = 0; i < n; i += 512) buffer[i] = i;  // touch every page
  const bool avx2 = __builtin_cpu_supports("avx2");
  double best = 0;
  volatile uint64_t sink = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
    for (int t = 0; t < threads; ++t) {
      const size_t chunk = n / static_cast<size_t>(threads) / 16 * 16;
      const uint64_t* p = buffer.data() + static_cast<size_t>(t) * chunk;
      total += avx2 ? sum_avx2(p, chunk) : sum_scalar(p, chunk);
    }
    sink = sink + total;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(kBytes) / s / 1e9);
  }
  return best;
}

}  // namespace kvserve::cli
