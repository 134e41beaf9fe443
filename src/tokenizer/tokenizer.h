#pragma once
// Text <-> token ids from a GGUF file's tokenizer.ggml.* metadata. Two
// vocabulary kinds are supported:
//  - "gpt2": byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM): a regex-style
//    pre-tokenizer splits the text, each piece's bytes are mapped to
//    printable characters and merged by the ranked merges list;
//  - "llama": SentencePiece BPE (Llama 1/2, TinyLlama): spaces become U+2581,
//    adjacent pieces merge by highest score, and uncovered bytes fall back to
//    <0xNN> tokens.
// Control tokens written literally in the text, such as "<|im_start|>",
// become their id when parse_special is set; user-defined ones (Gemma's runs
// of spaces and newlines, HTML tags) always do, as in llama.cpp.
// A built Tokenizer is immutable; all methods are const and thread-safe.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace kvserve {

class GGUFFile;

// GGUF's tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class VocabKind { kBytePairGpt2, kSentencePiece };

// A string -> id map that can be probed with a string_view without copying.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
// Fill-in-the-middle tokens (-1: the vocabulary has none): prefix, suffix
// and middle markers, the padding, repository and file-separator tokens of
// repository-level FIM (Qwen2.5-Coder).
struct FimTokens {
  int32_t prefix = -1, suffix = -1, middle = -1, pad = -1, repo = -1, file_sep = -1;
  bool supported() const { return prefix >= 0 && suffix >= 0 && middle >= 0; }
};

using PieceIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from the file. Throws kvserve::Error naming the
  // file and key on bad or missing data.
  static Tokenizer from_gguf(const GGUFFile& file);

  // parse_special: text equal to a control token's piece (e.g.
  // "<|im_start|>") becomes that token instead of being split. User-defined
  // pieces are matched either way.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const;
  // The raw bytes this token decodes to ("" for control tokens such as BOS).
  std::string token_bytes(int32_t id) const;
  // Concatenated token bytes; with a SentencePiece prefix space, the space
  // that encoding added in front of the first word is removed again.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t bos_id() const { return bos_id_; }  // -1 when the vocabulary has none
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // EOS, EOT, EOM and end-of-turn control tokens (<|im_end|>, <|eot_id|>, ...),
  // and the FIM padding, repository and file-separator tokens (as llama.cpp).
  bool is_end_of_generation(int32_t id) const;
  const FimTokens& fim() const { return fim_; }
  // Whether decoding drops one leading space from the token at `position` of
  // a sequence starting with `first_id`: the SentencePiece prefix space,
  // which sits on the first token after an optional BOS.
  bool strips_leading_space(size_t position, int32_t first_id) const;

  // The most bytes of input text one token stands for (its piece or its
  // bytes, at least 4): a text of more than k times this has more than k tokens.
  size_t max_text_bytes_per_token() const { return max_text_bytes_per_token_; }

  VocabKind kind() const { return kind_; }
  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const;  // the vocab string as stored
  TokenType token_type(int32_t id) const;
  int32_t find_piece(std::string_view piece) const;  // -1 if absent

 private:
  struct MergeResult {
    int32_t rank;
    int32_t merged_id;
  };
  struct SpecialPiece {
    std::string text;
    int32_t id;
    bool control;  // matched only with parse_special
  };

  Tokenizer() = default;
  void load_vocabulary(const GGUFFile& file);
  void load_special_ids(const GGUFFile& file);
  template <class ReadId>
  void load_fim_ids(const ReadId& read_id);
  void load_merges(const GGUFFile& file);
  void prepare_byte_tokens();
  void collect_special_pieces();
  void check_id(int32_t id) const;  // throws for an id outside the vocabulary

  // Encodes text that holds no special tokens; `at_text_start` says whether
  // it follows the start of the input or a special token (which is where
  // SentencePiece adds its prefix space).
  void encode_fragment(std::string_view text, bool at_text_start, std::vector<int32_t>& out) const;
  void encode_gpt2_word(std::string_view word, std::vector<int32_t>& out) const;
  // Byte-level BPE proper: merges adjacent ids by rank until none applies.
  void apply_merges(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, bool add_prefix, std::vector<int32_t>& out) const;
  // The longest special piece starting at text[pos], nullptr if none.
  const SpecialPiece* special_at(std::string_view text, size_t pos, bool parse_special) const;

  VocabKind kind_ = VocabKind::kBytePairGpt2;
  PreTokenizer pre_tokenizer_ = PreTokenizer::kGpt2;
  std::vector<std::string> pieces_;
  std::vector<TokenType> types_;
  std::vector<float> scores_;
  std::vector<std::string> decoded_;  // token_bytes() of every id
  PieceIndex piece_to_id_;
  // Byte-level BPE: (left id << 32 | right id) -> rank and result.
  std::unordered_map<uint64_t, MergeResult> merges_;
  // The token of each single byte: GPT-2's mapped character, or SentencePiece's <0xNN>.
  std::vector<int32_t> byte_token_;
  // Special pieces, longest first, bucketed by their first byte.
  std::vector<std::vector<SpecialPiece>> specials_by_first_byte_;
  std::vector<bool> end_of_generation_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t unknown_id_ = -1;
  FimTokens fim_;
  bool add_bos_ = false;
  bool add_space_prefix_ = false;
  bool ignore_merges_ = false;  // Llama 3: a word that is a whole token skips merging
  size_t max_text_bytes_per_token_ = 4;
};

// Streams text out of token ids, holding back bytes until they form complete
// UTF-8 characters; bytes that can never complete a character come out as
// U+FFFD. The concatenated output equals decode(ids) whenever that is valid
// UTF-8.
class TokenTextStream {
 public:
  explicit TokenTextStream(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);  // returns the newly completed text (may be "")
  std::string flush();           // whatever remains (invalid bytes replaced by U+FFFD)

 private:
  const Tokenizer* tok_;
  std::string pending_;  // bytes of a character not yet complete
  size_t count_ = 0;      // tokens pushed so far
  int32_t first_id_ = -1;
};

}  // namespace kvserve
