#include "apps/membw.h"

#include <algorithm>

#include "core/aligned_buffer.h"
#include "kernels/read_bandwidth.h"

namespace kvserve::cli {

double measure_read_bandwidth_gbps(int threads) {
  // 1 GiB: several times the 260 MB L3 of the target machine.
  AlignedBuffer<uint8_t> buffer(size_t{1} << 30);
  for (size_t i = 0; i < buffer.size(); i += 4096) buffer[i] = static_cast<uint8_t>(i >> 12);  // touch every page
  double best = 0;
  for (int pass = 0; pass < 2; ++pass) best = std::max(best, read_bandwidth_gbps(buffer.data(), buffer.size(), threads));
  return best;
}

}  // namespace kvserve::cli
