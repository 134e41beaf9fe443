#pragma once
// The naive (full recompute) and cached decoders over one model: the same
// logits and greedy tokens, shared by the architecture suites (MoE, MLA).
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "decode/decoder.h"
#include "model/model.h"
#include "test_util.h"

namespace kvserve::decoder_agreement {

// Prompts of 1, 6 and 33 tokens, then 6 greedy steps: logits within 1e-4
// relative, and the same argmax at every step.
inline void expect_naive_and_cached_decoders_agree(const Model& m, const std::string& label) {
  for (int64_t n : {1, 6, 33}) {
    auto naive = make_decoder("naive", m, 256), cached = make_decoder("cached", m, 256);
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < n; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 11) % m.config().vocab_size));
    std::span<const float> a = naive->append(tokens), b = cached->append(tokens);
    for (int s = 0; s < 6; ++s) {
      std::vector<float> la(a.begin(), a.end()), lb(b.begin(), b.end());
      EXPECT_LT(test_util::relative_error(lb, la), 1e-4) << label << " prompt " << n << " step " << s;
      const auto next = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
      ASSERT_EQ(next, static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin())) << label;
      a = naive->append(std::span<const int32_t>(&next, 1));
      b = cached->append(std::span<const int32_t>(&next, 1));
    }
  }
}

}  // namespace kvserve::decoder_agreement
