// SentencePiece BPE (tokenizer.ggml.model = "llama"), as llama.cpp's
// llm_tokenizer_spm does it: start from single characters and keep merging
// the adjacent pair whose concatenation is the highest-scoring vocabulary
// piece; characters no piece covers fall back to <0xNN> byte tokens.
#include <functional>
#include <optional>
#include <queue>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_text.h"

namespace kvserve {

namespace {

// A stretch of the text: one character at first, longer once merged.
struct PieceSpan {
  uint32_t offset;
  uint32_t length;
};

// Merges adjacent segments of `text`, best score first (leftmost on ties),
// while their concatenation has a score; returns the final segments in order.
std::vector<PieceSpan> merge_by_score(std::string_view text, const std::vector<Utf8Char>& chars,
                                    const std::function<std::optional<float>(std::string_view)>& score_of) {
  // A doubly linked list; a merged-away symbol has length 0.
  struct Symbol {
    PieceSpan segment;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(chars.size());
  std::vector<Symbol> symbols(chars.size());
  for (int32_t i = 0; i < n; ++i) symbols[i] = {{chars[i].offset, chars[i].length}, i - 1, i + 1 < n ? i + 1 : -1};

  struct Candidate {
    float score;
    int32_t left;
    uint32_t left_length;
    uint32_t right_length;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  const auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const PieceSpan& l = symbols[left].segment;
    const PieceSpan& r = symbols[symbols[left].next].segment;
    if (const auto score = score_of(text.substr(l.offset, l.length + r.length))) {
      queue.push({*score, left, l.length, r.length});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    // Stale when either side has grown or been absorbed since.
    if (left.segment.length != c.left_length || left.next < 0 ||
        symbols[left.next].segment.length != c.right_length) {
      continue;
    }
    Symbol& right = symbols[left.next];
    left.segment.length += right.segment.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.segment.length = 0;
    consider(left.prev);
    consider(c.left);
  }
  std::vector<PieceSpan> segments;
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) segments.push_back(symbols[i].segment);
  return segments;
}

}  // namespace

void Tokenizer::encode_spm(std::string_view raw_text, bool add_prefix, std::vector<int32_t>& out) const {
  const std::string text = spm_escape_spaces(add_prefix ? " " + std::string(raw_text) : std::string(raw_text));
  const auto score_of = [&](std::string_view piece) -> std::optional<float> {
    const int32_t id = find_piece(piece);
    return id >= 0 ? std::optional<float>(scores_[id]) : std::nullopt;
  };
  for (const PieceSpan& segment : merge_by_score(text, decode_utf8(text), score_of)) {
    const std::string_view piece = std::string_view(text).substr(segment.offset, segment.length);
    if (const int32_t id = find_piece(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only single characters can be missing: merges always form known pieces.
    for (char c : piece) {
      const int32_t id = byte_token_[static_cast<uint8_t>(c)];
      if (id < 0) {
        throw Error("cannot encode \"" + std::string(piece) +
                    "\": the vocabulary has no byte-fallback token for it and no unknown token");
      }
      out.push_back(id);
    }
  }
}

}  // namespace kvserve
