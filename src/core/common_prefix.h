#pragma once
// Leading tokens two token sequences share: what a cache built over one of
// them can keep for the other (the scheduler's prefix deferral, the draft
// model's caches).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace kvserve {

inline size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first -
                             a.begin());
}

}  // namespace kvserve
