// find_linear (tokenizer/text_search.h): the same answers as std::string::find,
// in linear time on the inputs that make std::string::find quadratic.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tokenizer/text_search.h"

using namespace kvserve;

TEST(TextSearch, MatchesStdFindOnSmallAlphabets) {
  std::mt19937 rng(7);
  for (int iteration = 0; iteration < 200000; ++iteration) {
    const unsigned alphabet = 1 + rng() % 3;  // few letters: many periodic needles and partial matches
    std::string haystack(rng() % 40, 'a'), needle(rng() % 9, 'a');
    for (char& c : haystack) c = static_cast<char>('a' + rng() % alphabet);
    for (char& c : needle) c = static_cast<char>('a' + rng() % alphabet);
    const size_t from = rng() % (haystack.size() + 2);
    const size_t expected = from > haystack.size() ? std::string::npos : haystack.find(needle, from);
    ASSERT_EQ(find_linear(haystack, needle, from), expected) << haystack << " / " << needle << " from " << from;
  }
  EXPECT_EQ(find_linear("abc", "", 3), 3u);
  EXPECT_EQ(find_linear("abc", "", 4), std::string::npos);
  EXPECT_EQ(find_linear("<think>x</think>y", "</think>"), 8u);
}

// Each of these takes std::string::find about n*m/2 comparisons (hours); here
// a few passes over 4 MiB. Run under the sanitizers too, so no tight timing.
TEST(TextSearch, QuadraticInputsForStdFindAreLinear) {
  const std::string a(4 << 20, 'a');
  EXPECT_EQ(find_linear(a + a, a + "b"), std::string::npos);
  EXPECT_EQ(find_linear(a, std::string(2 << 20, 'a') + "b" + std::string(100, 'a')), std::string::npos);
  EXPECT_EQ(find_linear(a + "b", std::string(2 << 20, 'a') + "b"), (2u << 20));
  std::string ab;
  for (int i = 0; i < (2 << 20); ++i) ab += "ab";
  EXPECT_EQ(find_linear(ab, ab.substr(0, 1 << 20) + "c"), std::string::npos);
}
