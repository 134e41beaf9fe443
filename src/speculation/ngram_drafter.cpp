#include "speculation/ngram_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {

int64_t find_ngram_continuation(std::span<const int32_t> history, int64_t n) {
  const auto size = static_cast<int64_t>(history.size());
  if (n <= 0 || size <= n) return -1;
  const auto pattern = history.subspan(static_cast<size_t>(size - n));
  // Latest first: recent text predicts the next tokens best. The match must
  // end before the pattern itself so that something follows it.
  for (int64_t start = size - n - 1; start >= 0; --start) {
    const auto candidate = history.subspan(static_cast<size_t>(start), static_cast<size_t>(n));
    if (std::equal(candidate.begin(), candidate.end(), pattern.begin())) return start + n;
  }
  return -1;
}

NgramDrafter::NgramDrafter(int64_t max_ngram) : max_ngram_(max_ngram) {
  if (max_ngram < 1) throw Error("the n-gram drafter needs max_ngram >= 1, got " + std::to_string(max_ngram));
}

void NgramDrafter::propose(std::span<const int32_t> history, int64_t k, Sampler&, DraftProposal& out) {
  out.tokens.clear();
  out.probs.clear();
  last_match_ = 0;
  if (k <= 0) return;
  for (int64_t n = max_ngram_; n >= 1; --n) {
    const int64_t from = find_ngram_continuation(history, n);
    if (from < 0) continue;
    // A match that overlaps the pattern itself (p = size - from < n) shows
    // text repeating with period p over its last n + p tokens: small models'
    // greedy loops ("figs, figs, figs, ..."), runs of indentation or zeros.
    // Then the copy goes on as LZ77's does, with the tokens it has just
    // proposed, and drafts k tokens instead of p. Any other continuation ends
    // with history (extended, a one-token match's guess drafted 8 tokens
    // where 2 were due, and fixed prompt lookup accepted 5% of them).
    const auto size = static_cast<int64_t>(history.size());
    const int64_t count = size - from < n ? k : std::min(k, size - from);
    for (int64_t i = 0; i < count; ++i)
      out.tokens.push_back(from + i < size ? history[static_cast<size_t>(from + i)]
                                           : out.tokens[static_cast<size_t>(from + i - size)]);
    last_match_ = n;
    return;
  }
}

}  // namespace kvserve
