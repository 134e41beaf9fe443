#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/vocab_text.h"

namespace kvserve {

namespace {

// Turn-ending control tokens of the common chat formats; a model stops when
// it emits one even if the file's EOS names another token.
constexpr std::array<std::string_view, 9> kEndOfTurnPieces{
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>",
    "</s>",       "<|end|>",    "<end_of_turn>", "<|return|>"};

std::string token_text_for(VocabKind kind, TokenType type, const std::string& piece) {
  if (type == TokenType::kControl) return "";
  if (kind == VocabKind::kBytePairGpt2) {
    // User-defined pieces are stored as plain text, not in the byte mapping.
    return type == TokenType::kUserDefined ? piece : gpt2_piece_to_bytes(piece);
  }
  if (type == TokenType::kByte) {
    if (const auto byte = parse_byte_piece(piece)) return std::string(1, static_cast<char>(*byte));
  }
  // SentencePiece renders an unknown token as " ⁇ ".
  if (type == TokenType::kUnknown) return " \xE2\x81\x87 ";
  return spm_unescape_spaces(piece);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GGUFFile& file) {
  Tokenizer tok;
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model == "gpt2") {
    tok.kind_ = VocabKind::kBytePairGpt2;
  } else if (model == "llama") {
    tok.kind_ = VocabKind::kSentencePiece;
  } else {
    throw Error(file.path() + ": tokenizer.ggml.model is \"" + model +
                "\"; kvserve supports \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)");
  }
  tok.load_vocabulary(file);
  if (tok.kind_ == VocabKind::kBytePairGpt2) {
    const std::string pre = file.get_string("tokenizer.ggml.pre", "default");
    const auto kind = pre_tokenizer_from_name(pre);
    if (!kind) {
      throw Error(file.path() + ": tokenizer.ggml.pre is \"" + pre + "\", which kvserve does not know; known: " +
                  known_pre_tokenizer_names());
    }
    tok.pre_tokenizer_ = *kind;
    tok.ignore_merges_ = *kind == PreTokenizer::kLlama3;
    tok.load_merges(file);
  }
  const bool spm = tok.kind_ == VocabKind::kSentencePiece;
  tok.add_bos_ = file.get_bool("tokenizer.ggml.add_bos_token", spm);
  tok.add_space_prefix_ = spm && file.get_bool("tokenizer.ggml.add_space_prefix", true);
  tok.load_special_ids(file);
  tok.prepare_byte_tokens();
  tok.collect_special_pieces();
  return tok;
}

void Tokenizer::load_vocabulary(const GGUFFile& file) {
  pieces_ = file.get_string_array("tokenizer.ggml.tokens").to_vector();
  if (pieces_.empty() || pieces_.size() > static_cast<size_t>(INT32_MAX)) {
    throw Error(file.path() + ": tokenizer.ggml.tokens holds " + std::to_string(pieces_.size()) +
                " tokens; a vocabulary needs at least one");
  }
  const size_t n = pieces_.size();
  const auto check_length = [&](const char* key, size_t got) {
    if (got != n) {
      throw Error(file.path() + ": " + key + " has " + std::to_string(got) + " entries but tokenizer.ggml.tokens has " +
                  std::to_string(n));
    }
  };
  types_.assign(n, TokenType::kNormal);
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<double>& types = file.get_number_array("tokenizer.ggml.token_type");
    check_length("tokenizer.ggml.token_type", types.size());
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] > 6 || types[i] != static_cast<int32_t>(types[i])) {
        throw Error(file.path() + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] = " +
                    std::to_string(types[i]) + " is not a token type (0..6)");
      }
      types_[i] = static_cast<TokenType>(static_cast<int32_t>(types[i]));
    }
  } else if (kind_ == VocabKind::kSentencePiece) {
    // Without types, recognize byte-fallback pieces by their spelling.
    for (size_t i = 0; i < n; ++i) {
      if (parse_byte_piece(pieces_[i])) types_[i] = TokenType::kByte;
    }
  }
  scores_.assign(n, 0.0f);
  if (file.has("tokenizer.ggml.scores")) {
    const std::vector<double>& scores = file.get_number_array("tokenizer.ggml.scores");
    check_length("tokenizer.ggml.scores", scores.size());
    std::transform(scores.begin(), scores.end(), scores_.begin(), [](double s) { return static_cast<float>(s); });
  }
  piece_to_id_.reserve(n);
  decoded_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    piece_to_id_.emplace(pieces_[i], static_cast<int32_t>(i));  // the first of duplicates wins
    decoded_[i] = token_text_for(kind_, types_[i], pieces_[i]);
    // A special piece is matched as written, any other token stands for its bytes (an unknown one for a
    // character: <= 4 bytes).
    const bool special = types_[i] == TokenType::kControl || types_[i] == TokenType::kUserDefined;
    max_text_bytes_per_token_ = std::max(max_text_bytes_per_token_, special ? pieces_[i].size() : decoded_[i].size());
  }
}

void Tokenizer::load_special_ids(const GGUFFile& file) {
  const bool spm = kind_ == VocabKind::kSentencePiece;
  // Returns -1 when the key is absent and there is no default.
  const auto read_id = [&](const std::string& key, int64_t fallback) -> int32_t {
    if (!file.has(key)) return fallback < vocab_size() ? static_cast<int32_t>(fallback) : -1;
    const uint64_t id = file.get_uint(key);
    if (id >= static_cast<uint64_t>(vocab_size())) {
      throw Error(file.path() + ": " + key + " = " + std::to_string(id) + " is outside the vocabulary of " +
                  std::to_string(vocab_size()) + " tokens");
    }
    return static_cast<int32_t>(id);
  };
  // SentencePiece's conventional ids <unk>=0, <s>=1, </s>=2 when unstated.
  bos_id_ = read_id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  eos_id_ = read_id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  unknown_id_ = read_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  end_of_generation_.assign(pieces_.size(), false);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (const int32_t id = read_id(key, -1); id >= 0) end_of_generation_[id] = true;
  }
  if (eos_id_ >= 0) end_of_generation_[eos_id_] = true;
  load_fim_ids(read_id);
  for (int32_t id : {fim_.pad, fim_.repo, fim_.file_sep})  // a FIM completion ends at the next file
    if (id >= 0) end_of_generation_[id] = true;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const bool special = types_[i] == TokenType::kControl || types_[i] == TokenType::kUserDefined;
    if (special && std::find(kEndOfTurnPieces.begin(), kEndOfTurnPieces.end(), pieces_[i]) != kEndOfTurnPieces.end()) {
      end_of_generation_[i] = true;
    }
  }
}

// The GGUF's FIM ids (tokenizer.ggml.fim_*_token_id, or the older prefix /
// suffix / middle keys), else the first special token named as a known model
// family names it (llama.cpp's fallbacks).
template <class ReadId>
void Tokenizer::load_fim_ids(const ReadId& read_id) {
  struct Kind {
    int32_t* id;
    const char* key;
    const char* old_key;
    std::vector<std::string_view> names;
  };
  const std::vector<Kind> kinds = {
      {&fim_.prefix, "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id",
       {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
        "▁<PRE>"}},
      {&fim_.suffix, "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id",
       {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
        "▁<SUF>"}},
      {&fim_.middle, "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id",
       {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
        "▁<MID>"}},
      {&fim_.pad, "tokenizer.ggml.fim_pad_token_id", nullptr, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"}},
      {&fim_.repo, "tokenizer.ggml.fim_rep_token_id", nullptr,
       {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {&fim_.file_sep, "tokenizer.ggml.fim_sep_token_id", nullptr, {"<|file_sep|>", "<fim-sep>", "<file_sep>"}}};
  for (const Kind& kind : kinds) {
    *kind.id = read_id(kind.key, -1);
    if (*kind.id < 0 && kind.old_key) *kind.id = read_id(kind.old_key, -1);
    for (size_t n = 0; *kind.id < 0 && n < kind.names.size(); ++n) {
      const int32_t id = find_piece(kind.names[n]);
      if (id >= 0 && (types_[id] == TokenType::kControl || types_[id] == TokenType::kUserDefined)) *kind.id = id;
    }
  }
}

void Tokenizer::prepare_byte_tokens() {
  byte_token_.assign(256, unknown_id_);
  for (int b = 0; b < 256; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    int32_t id = -1;
    if (kind_ == VocabKind::kBytePairGpt2) {
      id = find_piece(gpt2_byte_to_piece(byte));
    } else {
      constexpr char kDigits[] = "0123456789ABCDEF";
      id = find_piece(std::string("<0x") + kDigits[b >> 4] + kDigits[b & 15] + ">");
      if (id < 0) id = find_piece(std::string(1, static_cast<char>(byte)));
    }
    if (id >= 0) byte_token_[b] = id;
  }
}

void Tokenizer::collect_special_pieces() {
  specials_by_first_byte_.assign(256, {});
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const bool special = types_[i] == TokenType::kControl || types_[i] == TokenType::kUserDefined;
    if (!special || pieces_[i].empty()) continue;
    // llama.cpp treats a user-defined token that reads like an end of turn
    // (Gemma's "</s>") as a control token.
    const bool control = types_[i] == TokenType::kControl || end_of_generation_[i];
    specials_by_first_byte_[static_cast<uint8_t>(pieces_[i][0])].push_back(
        {pieces_[i], static_cast<int32_t>(i), control});
  }
  for (auto& bucket : specials_by_first_byte_) {
    // Longest first, so "<|im_start|>" wins over a shorter piece it starts with.
    std::stable_sort(bucket.begin(), bucket.end(),
                     [](const SpecialPiece& a, const SpecialPiece& b) { return a.text.size() > b.text.size(); });
  }
}

const Tokenizer::SpecialPiece* Tokenizer::special_at(std::string_view text, size_t pos, bool parse_special) const {
  for (const SpecialPiece& special : specials_by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    if ((parse_special || !special.control) && text.substr(pos).starts_with(special.text)) return &special;
  }
  return nullptr;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> ids;
  if (add_bos && bos_id_ >= 0) ids.push_back(bos_id_);
  size_t fragment_begin = 0;
  bool after_special = true;  // the start of the text counts as following one
  const auto flush_fragment = [&](size_t end) {
    if (end == fragment_begin) return;
    encode_fragment(text.substr(fragment_begin, end - fragment_begin), after_special, ids);
    after_special = false;
  };
  for (size_t pos = 0; pos < text.size();) {
    const SpecialPiece* special = special_at(text, pos, parse_special);
    if (!special) {
      ++pos;
      continue;
    }
    flush_fragment(pos);
    ids.push_back(special->id);
    after_special = true;
    pos += special->text.size();
    fragment_begin = pos;
  }
  flush_fragment(text.size());
  return ids;
}

void Tokenizer::encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
  if (kind_ == VocabKind::kSentencePiece) {
    // llama.cpp adds the prefix space at the start and again after every special token.
    encode_spm(text, add_space_prefix_ && after_special, out);
    return;
  }
  for (const auto& [begin, end] : pre_tokenize(text, pre_tokenizer_)) {
    encode_gpt2_word(text.substr(begin, end - begin), out);
  }
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_size()) +
                " tokens");
  }
}

std::string Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return decoded_[id];
}

bool Tokenizer::strips_leading_space(size_t position, int32_t first_id) const {
  if (!add_space_prefix_) return false;
  return position == (first_id == bos_id_ ? 1u : 0u);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i]);
    const std::string& bytes = decoded_[ids[i]];
    const bool strip = strips_leading_space(i, ids[0]) && bytes.starts_with(' ');
    text.append(bytes, strip ? 1 : 0);
  }
  return text;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && id < vocab_size() && end_of_generation_[id];
}

const std::string& Tokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

int32_t Tokenizer::find_piece(std::string_view piece) const {
  const auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

}  // namespace kvserve
