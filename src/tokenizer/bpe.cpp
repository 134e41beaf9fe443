// Byte-level BPE (tokenizer.ggml.model = "gpt2"): merges loading and the
// per-word merge loop.
#include <algorithm>
#include <queue>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_text.h"

namespace kvserve {

namespace {

std::string hex_byte(uint8_t b) {
  constexpr char kDigits[] = "0123456789ABCDEF";
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 15];
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

void Tokenizer::load_merges(const GGUFFile& file) {
  const std::string key = "tokenizer.ggml.merges";
  const GGUFStrings& merges = file.get_string_array(key);
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string_view merge = merges[rank];
    const auto where = [&] { return file.path() + ": " + key + "[" + std::to_string(rank) + "] = \"" + std::string(merge) + "\""; };
    // Search from 1: a piece is never empty, so a leading space belongs to it.
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos || space + 1 == merge.size()) {
      throw Error(where() + " is not two pieces separated by a space; the merges list is corrupt");
    }
    const std::string_view text = merge;
    const int32_t left = find_piece(text.substr(0, space));
    const int32_t right = find_piece(text.substr(space + 1));
    const int32_t merged = find_piece(std::string(text.substr(0, space)) + std::string(text.substr(space + 1)));
    if (left < 0 || right < 0 || merged < 0) {
      throw Error(where() + " names a piece that is not in tokenizer.ggml.tokens; the vocabulary and merges do "
                            "not belong together");
    }
    merges_.emplace(pair_key(left, right), MergeResult{static_cast<int32_t>(rank), merged});
  }
}

void Tokenizer::encode_gpt2_word(std::string_view word, std::vector<int32_t>& out) const {
  const auto byte_id = [&](char c) {
    const int32_t id = byte_token_[static_cast<uint8_t>(c)];
    if (id < 0) {
      throw Error("cannot encode byte " + hex_byte(static_cast<uint8_t>(c)) +
                  ": the vocabulary has no token for it and no unknown token");
    }
    return id;
  };
  if (word.size() == 1) {
    out.push_back(byte_id(word[0]));
    return;
  }
  if (ignore_merges_) {
    // Llama 3 takes a word that is itself a token as is, even where the merges would split it.
    std::string mapped;
    for (char c : word) mapped += gpt2_byte_to_piece(static_cast<uint8_t>(c));
    if (const int32_t id = find_piece(mapped); id >= 0) {
      out.push_back(id);
      return;
    }
  }

  std::vector<int32_t> ids(word.size());
  std::transform(word.begin(), word.end(), ids.begin(), byte_id);
  apply_merges(ids, out);
}

void Tokenizer::apply_merges(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const {
  if (ids.empty()) return;
  // A doubly linked list of symbols, one per byte to begin with. Merged-away
  // symbols keep their slot with id kDead.
  constexpr int32_t kDead = -2;
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> symbols(ids.size());
  for (int32_t i = 0; i < n; ++i) symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};

  // The lowest rank merges first; among equal ranks, the leftmost.
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
  };
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  const auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[symbols[left].next].id;
    const auto it = merges_.find(pair_key(left_id, right_id));
    if (it != merges_.end()) queue.push({it->second.rank, left, left_id, right_id, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    // Stale when either side has merged with something else since.
    if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
    Symbol& right = symbols[left.next];
    left.id = c.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.id = kDead;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace kvserve
