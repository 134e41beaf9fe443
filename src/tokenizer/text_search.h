#pragma once
// Substring search in linear time. std::string::find compares the needle at
// every position where its first byte occurs: O(n*m) on inputs such as
// "aaa...a" and "aa...ab", which a chat template (untrusted code) can build.
#include <cstddef>
#include <string_view>

namespace kvserve {

// The first position at or after `from` where `needle` occurs in `haystack`,
// or std::string_view::npos; an empty needle occurs at `from` (if in range).
// At most 2 * (haystack.size() - from) + 2 * needle.size() byte comparisons
// (Crochemore and Perrin's two-way algorithm) and no allocation.
size_t find_linear(std::string_view haystack, std::string_view needle, size_t from = 0);

}  // namespace kvserve
