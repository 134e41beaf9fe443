// SentencePiece BPE (tokenizer.ggml.model = "llama"), as llama.cpp's
// llm_tokenizer_spm does it: start from single characters and keep merging
// the adjacent pair whose concatenation is the highest-scoring vocabulary
// piece; characters no piece covers fall back to <0xNN> byte tokens.
#include <queue>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_text.h"

namespace kvserve {

void Tokenizer::encode_spm(std::string_view raw_text, bool add_prefix, std::vector<int32_t>& out) const {
  const std::string text = spm_escape_spaces(add_prefix ? " " + std::string(raw_text) : std::string(raw_text));
  const std::vector<Utf8Char> chars = decode_utf8(text);
  if (chars.empty()) return;

  // Symbols are byte ranges of `text`; a merged-away symbol has length 0.
  struct Symbol {
    uint32_t offset;
    uint32_t length;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(chars.size());
  std::vector<Symbol> symbols(chars.size());
  for (int32_t i = 0; i < n; ++i) symbols[i] = {chars[i].offset, chars[i].length, i - 1, i + 1 < n ? i + 1 : -1};

  // The highest score merges first; among equal scores, the leftmost.
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
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[l.next];
    const int32_t id = find_piece(std::string_view(text).substr(l.offset, l.length + r.length));
    if (id >= 0) queue.push({scores_[id], left, l.length, r.length});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    // Stale when either side has grown or been absorbed since.
    if (left.length != c.left_length || left.next < 0 || symbols[left.next].length != c.right_length) continue;
    Symbol& right = symbols[left.next];
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.length = 0;
    consider(left.prev);
    consider(c.left);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = std::string_view(text).substr(symbols[i].offset, symbols[i].length);
    if (const int32_t id = find_piece(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only single characters can be missing: merges always form known pieces.
    for (char c : piece) {
      const int32_t id = byte_token_[static_cast<uint8_t>(c)];
      if (id < 0) throw Error("cannot encode \"" + std::string(piece) + "\": the vocabulary has no byte-fallback "
                              "token for it and no unknown token");
      out.push_back(id);
    }
  }
}

}  // namespace kvserve
