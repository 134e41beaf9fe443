// The two-way string matching algorithm (Crochemore and Perrin, "Two-way
// string-matching", J. ACM 38(3), 1991), in the form of musl's memmem: the
// needle is cut at a critical factorization; its right part is compared left
// to right, then its left part right to left, and `memory` remembers the
// prefix known to match after a shift by the period, which keeps it linear.
// A last-byte shift table skips ahead fast on ordinary text.
#include "tokenizer/text_search.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

namespace kvserve {

namespace {

// The start of the maximal suffix of the needle under one byte order (or the
// reverse order), and its period. Starts at SIZE_MAX, the position before 0:
// unsigned arithmetic wraps it to 0 on the first step.
struct Suffix {
  size_t start;
  size_t period;
};

Suffix maximal_suffix(const unsigned char* n, size_t l, bool reverse) {
  size_t ip = SIZE_MAX, jp = 0, k = 1, p = 1;
  while (jp + k < l) {
    const unsigned char a = n[ip + k], b = n[jp + k];
    if (a == b) {
      if (k == p) jp += p, k = 1;
      else ++k;
    } else if (reverse ? a < b : a > b) {
      jp += k, k = 1, p = jp - ip;
    } else {
      ip = jp++, k = p = 1;
    }
  }
  return {ip, p};
}

size_t two_way(const unsigned char* h, size_t hl, const unsigned char* n, size_t l) {
  constexpr size_t kWordBits = sizeof(size_t) * CHAR_BIT;
  size_t byteset[256 / kWordBits] = {};
  size_t shift[256];
  for (size_t i = 0; i < l; ++i) {
    byteset[n[i] / kWordBits] |= size_t{1} << (n[i] % kWordBits);
    shift[n[i]] = i + 1;
  }
  const Suffix forward = maximal_suffix(n, l, false), backward = maximal_suffix(n, l, true);
  const Suffix critical = backward.start + 1 > forward.start + 1 ? backward : forward;
  const size_t ms = critical.start;  // the left part is n[0, ms], SIZE_MAX: empty
  size_t p = critical.period, memory_after_period;
  if (std::memcmp(n, n + p, ms + 1) != 0) {  // not periodic: shift past either part
    memory_after_period = 0;
    p = std::max(ms, l - ms - 1) + 1;
  } else {
    memory_after_period = l - p;
  }
  size_t memory = 0, at = 0;
  while (hl - at >= l) {
    const unsigned char* w = h + at;
    const unsigned char last = w[l - 1];
    if (!(byteset[last / kWordBits] >> (last % kWordBits) & 1)) {
      at += l, memory = 0;
      continue;
    }
    if (size_t k = l - shift[last]; k != 0) {
      at += std::max(k, memory), memory = 0;
      continue;
    }
    size_t k = std::max(ms + 1, memory);
    while (k < l && n[k] == w[k]) ++k;
    if (k < l) {
      at += k - ms, memory = 0;
      continue;
    }
    k = ms + 1;
    while (k > memory && n[k - 1] == w[k - 1]) --k;
    if (k <= memory) return at;
    at += p, memory = memory_after_period;
  }
  return std::string_view::npos;
}

}  // namespace

size_t find_linear(std::string_view haystack, std::string_view needle, size_t from) {
  if (from > haystack.size() || haystack.size() - from < needle.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  if (needle.size() == 1) return haystack.find(needle[0], from);  // memchr
  const size_t at = two_way(reinterpret_cast<const unsigned char*>(haystack.data() + from), haystack.size() - from,
                            reinterpret_cast<const unsigned char*>(needle.data()), needle.size());
  return at == std::string_view::npos ? at : from + at;
}

}  // namespace kvserve
