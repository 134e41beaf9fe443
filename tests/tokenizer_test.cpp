// Tokenizer tests: tiny GGUF vocabularies built here with GGUFWriter (both
// kinds), the pre-tokenizer patterns, the text stream, and, when the files
// are present, the real SmolLM2 (byte-level BPE) and llama2.c tok512
// (SentencePiece) vocabularies against independently computed ids.
#include <gtest/gtest.h>

#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_text.h"

namespace kvserve {
namespace {

using Ids = std::vector<int32_t>;

// Everything a tokenizer reads from a GGUF file; write() leaves out what is unset.
struct TokenizerMetadata {
  std::string model = "gpt2";
  std::optional<std::string> pre;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;
  std::vector<std::string> merges;
  std::map<std::string, uint32_t> ids;  // "bos" -> tokenizer.ggml.bos_token_id, ...
  std::optional<bool> add_bos;
  std::optional<bool> add_space_prefix;

  int32_t add(const std::string& piece, int32_t type = 1, float score = 0.0f) {
    tokens.push_back(piece);
    types.push_back(type);
    scores.push_back(score);
    return static_cast<int32_t>(tokens.size() - 1);
  }

  std::string write(const std::string& name) const {
    GGUFWriter w;
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.model", model);
    if (pre) w.set_string("tokenizer.ggml.pre", *pre);
    if (!tokens.empty()) w.set_string_array("tokenizer.ggml.tokens", tokens);
    if (!types.empty()) w.set_i32_array("tokenizer.ggml.token_type", types);
    if (model == "llama") w.set_f32_array("tokenizer.ggml.scores", scores);
    if (model == "gpt2") w.set_string_array("tokenizer.ggml.merges", merges);
    for (const auto& [key, id] : ids) w.set_u32("tokenizer.ggml." + key + "_token_id", id);
    if (add_bos) w.set_bool("tokenizer.ggml.add_bos_token", *add_bos);
    if (add_space_prefix) w.set_bool("tokenizer.ggml.add_space_prefix", *add_space_prefix);
    const std::string path = testing::TempDir() + "kvserve_tokenizer_" + name + ".gguf";
    w.write(path);
    return path;
  }

  Tokenizer load() const {
    const std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    const GGUFFile file(write(name));
    return Tokenizer::from_gguf(file);
  }
};

// GPT-2 byte-level spelling of raw bytes.
std::string mapped(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += gpt2_byte_to_piece(static_cast<uint8_t>(c));
  return out;
}

// A byte-level vocabulary: ids 0..255 are the single bytes, then special
// tokens, then one token per merge, each merge of raw byte strings.
struct TinyBpe {
  TokenizerMetadata meta;
  int32_t endoftext, im_start, im_end, tool;

  TinyBpe() {
    meta.pre = "gpt2";
    for (int b = 0; b < 256; ++b) meta.add(gpt2_byte_to_piece(static_cast<uint8_t>(b)));
    endoftext = meta.add("<|endoftext|>", 3);
    im_start = meta.add("<|im_start|>", 3);
    im_end = meta.add("<|im_end|>", 3);
    tool = meta.add("<tool>", 4);
    meta.ids = {{"bos", static_cast<uint32_t>(endoftext)}, {"eos", static_cast<uint32_t>(endoftext)}};
  }
  int32_t merge(std::string_view left, std::string_view right) {
    meta.merges.push_back(mapped(left) + " " + mapped(right));
    const std::string merged = mapped(std::string(left) + std::string(right));
    for (size_t i = 0; i < meta.tokens.size(); ++i) {
      if (meta.tokens[i] == merged) return static_cast<int32_t>(i);
    }
    return meta.add(merged);
  }
};

int32_t byte_id(char c) { return static_cast<uint8_t>(c); }

TEST(TokenizerBpe, MergesWordsAndRoundTrips) {
  TinyBpe bpe;
  bpe.merge("h", "e");
  bpe.merge("l", "l");
  bpe.merge("he", "ll");
  const int32_t hello = bpe.merge("hell", "o");
  bpe.merge(" ", "w");
  bpe.merge("o", "r");
  bpe.merge(" w", "or");
  bpe.merge("l", "d");
  const int32_t world = bpe.merge(" wor", "ld");
  const Tokenizer tok = bpe.meta.load();

  EXPECT_EQ(tok.kind(), VocabKind::kBytePairGpt2);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.encode("hello world", false), (Ids{hello, world}));
  EXPECT_EQ(tok.encode("hello world", true), (Ids{bpe.endoftext, hello, world}));
  // "hello!" -> the word, then "!" as its own piece; "  world" keeps one space apart.
  EXPECT_EQ(tok.encode("hello!  world", false), (Ids{hello, byte_id('!'), byte_id(' '), world}));
  EXPECT_EQ(tok.token_bytes(world), " world");
  EXPECT_EQ(tok.piece(world), "\xC4\xA0world");  // "Ġworld"
  EXPECT_EQ(tok.find_piece("\xC4\xA0world"), world);
  EXPECT_EQ(tok.find_piece("absent"), -1);
  EXPECT_EQ(tok.decode(tok.encode("hello world", true)), "hello world");
}

TEST(TokenizerBpe, LowestRankMergesFirst) {
  for (bool ab_first : {true, false}) {
    TinyBpe bpe;
    const int32_t ab = ab_first ? bpe.merge("a", "b") : -1;
    const int32_t bc = bpe.merge("b", "c");
    const int32_t ab_late = ab_first ? ab : bpe.merge("a", "b");
    const Tokenizer tok = bpe.meta.load();
    const Ids expected = ab_first ? Ids{ab_late, byte_id('c')} : Ids{byte_id('a'), bc};
    EXPECT_EQ(tok.encode("abc", false), expected) << "ab_first=" << ab_first;
  }
}

TEST(TokenizerBpe, MultiByteUtf8RoundTrips) {
  TinyBpe bpe;
  const int32_t e_acute = bpe.merge("\xC3", "\xA9");  // é
  bpe.merge("\xE6", "\x97");
  const int32_t nichi = bpe.merge("\xE6\x97", "\xA5");  // 日
  const Tokenizer tok = bpe.meta.load();

  EXPECT_EQ(tok.encode("\xC3\xA9", false), (Ids{e_acute}));
  EXPECT_EQ(tok.encode("\xE6\x97\xA5\xE6\x9C\xAC", false),  // 日本: 本 has no merges, so three bytes
            (Ids{nichi, 0xE6, 0x9C, 0xAC}));
  const std::vector<std::string> texts = {"caf\xC3\xA9 na\xC3\xAFve", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
                                 "emoji \xF0\x9F\x99\x82\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD!", "tab\tnl\r\n  end  ",
                                 std::string("nul\0byte", 8), "bad \xFF\xC3 utf8 \xE6\x97"};
  for (const std::string& text : texts) {
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  }
}

TEST(TokenizerBpe, ParsesSpecialTokens) {
  TinyBpe bpe;
  const Tokenizer tok = bpe.meta.load();
  const std::string text = "<|im_start|>hi<tool><|im_end|>";
  EXPECT_EQ(tok.encode(text, false),
            (Ids{bpe.im_start, byte_id('h'), byte_id('i'), bpe.tool, bpe.im_end}));
  // Without parse_special the markers are plain text, and decode gives it back.
  const Ids plain = tok.encode(text, false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), bpe.im_start), 0);
  EXPECT_EQ(tok.decode(plain), text);
  // A near miss is text too.
  EXPECT_EQ(tok.decode(tok.encode("<|im_start|", false)), "<|im_start|");
  // Control tokens decode to nothing; user-defined ones to their text.
  EXPECT_EQ(tok.token_bytes(bpe.im_start), "");
  EXPECT_EQ(tok.token_bytes(bpe.tool), "<tool>");
  EXPECT_EQ(tok.decode(tok.encode(text, false)), "hi<tool>");
}

TEST(TokenizerBpe, EndOfGeneration) {
  TinyBpe bpe;
  const Tokenizer tok = bpe.meta.load();
  EXPECT_EQ(tok.eos_id(), bpe.endoftext);
  EXPECT_TRUE(tok.is_end_of_generation(bpe.endoftext));
  EXPECT_TRUE(tok.is_end_of_generation(bpe.im_end));
  EXPECT_FALSE(tok.is_end_of_generation(bpe.im_start));
  EXPECT_FALSE(tok.is_end_of_generation(bpe.tool));
  EXPECT_FALSE(tok.is_end_of_generation(byte_id('a')));
  EXPECT_FALSE(tok.is_end_of_generation(-1));
}

TEST(TokenizerBpe, EotTokenIdCountsAsEndOfGeneration) {
  TinyBpe bpe;
  bpe.meta.ids["eot"] = byte_id('#');
  const Tokenizer tok = bpe.meta.load();
  EXPECT_TRUE(tok.is_end_of_generation(byte_id('#')));
}

TEST(TokenizerBpe, OutOfRangeIdsThrow) {
  TinyBpe bpe;
  const Tokenizer tok = bpe.meta.load();
  EXPECT_THROW(tok.token_bytes(tok.vocab_size()), Error);
  EXPECT_THROW(tok.decode({0, -1}), Error);
  EXPECT_THROW(tok.piece(100000), Error);
}

// Expected pieces are Hugging Face tokenizers' pre_tokenize_str output for
// the same patterns (tools/tokenizer_reference.py hf_pre_tokenizer).
std::vector<std::string> split(std::string_view text, PreTokenizer kind) {
  std::vector<std::string> pieces;
  for (const auto& [begin, end] : pre_tokenize(text, kind)) pieces.emplace_back(text.substr(begin, end - begin));
  return pieces;
}

using Pieces = std::vector<std::string>;

TEST(TokenizerPreTokenize, Gpt2Pattern) {
  const auto k = PreTokenizer::kGpt2;
  EXPECT_EQ(split("I'm  fine\n\n 123456 x", k), (Pieces{"I", "'m", " ", " fine", "\n\n", " 123456", " x"}));
  EXPECT_EQ(split("Hello WORLD'S 'RE  \t\n\r\n  end!!\n\nok", k),
            (Pieces{"Hello", " WORLD", "'", "S", " '", "RE", "  \t\n\r\n ", " end", "!!", "\n", "\n", "ok"}));
  EXPECT_EQ(split("na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xC2\xBD\xC2\xB2  ", k),
            (Pieces{"na\xC3\xAFve", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " \xC2\xBD\xC2\xB2", "  "}));
  EXPECT_EQ(split("a1b22 c333", k), (Pieces{"a", "1", "b", "22", " c", "333"}));
  EXPECT_TRUE(split("", k).empty());
}

TEST(TokenizerPreTokenize, SmolLmSplitsDigitsFirst) {
  const auto k = PreTokenizer::kGpt2SplitDigits;
  EXPECT_EQ(split("I'm  fine\n\n 123456 x", k),
            (Pieces{"I", "'m", " ", " fine", "\n\n ", "1", "2", "3", "4", "5", "6", " x"}));
  EXPECT_EQ(split("na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xC2\xBD\xC2\xB2  ", k),
            (Pieces{"na\xC3\xAFve", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " ", "\xC2\xBD", "\xC2\xB2", "  "}));
  EXPECT_EQ(split("a1b22 c333", k), (Pieces{"a", "1", "b", "2", "2", " c", "3", "3", "3"}));
}

TEST(TokenizerPreTokenize, Llama3Pattern) {
  const auto k = PreTokenizer::kLlama3;
  EXPECT_EQ(split("I'm  fine\n\n 123456 x", k), (Pieces{"I", "'m", " ", " fine", "\n\n", " ", "123", "456", " x"}));
  EXPECT_EQ(split("Hello WORLD'S 'RE  \t\n\r\n  end!!\n\nok", k),
            (Pieces{"Hello", " WORLD", "'S", " '", "RE", "  \t\n\r\n", " ", " end", "!!\n\n", "ok"}));
  EXPECT_EQ(split("na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xC2\xBD\xC2\xB2  ", k),
            (Pieces{"na\xC3\xAFve", " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " ", "\xC2\xBD\xC2\xB2", "  "}));
  EXPECT_EQ(split("a1b22 c333", k), (Pieces{"a", "1", "b", "22", " c", "333"}));
}

TEST(TokenizerPreTokenize, Qwen2Pattern) {
  const auto k = PreTokenizer::kQwen2;
  EXPECT_EQ(split("I'm  fine\n\n 123456 x", k),
            (Pieces{"I", "'m", " ", " fine", "\n\n", " ", "1", "2", "3", "4", "5", "6", " x"}));
  EXPECT_EQ(split("Hello WORLD'S 'RE  \t\n\r\n  end!!\n\nok", k),
            (Pieces{"Hello", " WORLD", "'S", " '", "RE", "  \t\n\r\n", " ", " end", "!!\n\n", "ok"}));
  EXPECT_EQ(split("a1b22 c333", k), (Pieces{"a", "1", "b", "2", "2", " c", "3", "3", "3"}));
}

TEST(TokenizerPreTokenize, NamesMapToPatterns) {
  EXPECT_EQ(pre_tokenizer_from_name("smollm"), PreTokenizer::kGpt2SplitDigits);
  EXPECT_EQ(pre_tokenizer_from_name("llama-bpe"), PreTokenizer::kLlama3);
  EXPECT_EQ(pre_tokenizer_from_name("qwen2"), PreTokenizer::kQwen2);
  EXPECT_EQ(pre_tokenizer_from_name("gpt2"), PreTokenizer::kGpt2);
  EXPECT_EQ(pre_tokenizer_from_name("no-such-pre"), std::nullopt);
}

// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte pieces, then
// scored pieces (higher scores merge first).
struct TinySpm {
  TokenizerMetadata meta;
  std::map<std::string, int32_t> id;

  TinySpm() {
    meta.model = "llama";
    meta.add("<unk>", 2);
    meta.add("<s>", 3);
    meta.add("</s>", 3);
    for (int b = 0; b < 256; ++b) {
      constexpr char kHex[] = "0123456789ABCDEF";
      meta.add(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", 6);
    }
    const std::vector<std::pair<std::string, float>> pieces = {
        {"\xE2\x96\x81", -5}, {"h", -6},   {"e", -6},     {"l", -6},      {"o", -6},  {"w", -6},
        {"r", -6},          {"d", -6},     {"a", -6},     {"he", -1},     {"ll", -1.5}, {"llo", -2},
        {"\xE2\x96\x81he", -2.5},          {"\xE2\x96\x81hello", -3},     {"or", -1}, {"\xE2\x96\x81w", -1.2},
        {"\xE2\x96\x81wor", -2},           {"ld", -2.2}, {"\xE2\x96\x81world", -3}, {"\xC3\xA9", -4}};
    for (const auto& [piece, score] : pieces) id[piece] = meta.add(piece, 1, score);
  }
  int32_t operator[](const std::string& piece) const { return id.at(piece); }
  static int32_t byte(uint8_t b) { return 3 + b; }
};

TEST(TokenizerSpm, GreedyHighestScoreMerges) {
  const TinySpm spm;
  const Tokenizer tok = spm.meta.load();
  EXPECT_EQ(tok.kind(), VocabKind::kSentencePiece);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.add_space_prefix());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.encode("hello world", true), (Ids{1, spm["\xE2\x96\x81hello"], spm["\xE2\x96\x81world"]}));
  // Two spaces: the first stays a lone "▁".
  EXPECT_EQ(tok.encode("hello  world", false),
            (Ids{spm["\xE2\x96\x81hello"], spm["\xE2\x96\x81"], spm["\xE2\x96\x81world"]}));
}

TEST(TokenizerSpm, ByteFallbackAndDecode) {
  const TinySpm spm;
  const Tokenizer tok = spm.meta.load();
  // "c" and 日 have no pieces: their UTF-8 bytes become <0xNN> tokens.
  EXPECT_EQ(tok.encode("hello \xE6\x97\xA5", false),
            (Ids{spm["\xE2\x96\x81hello"], spm["\xE2\x96\x81"], TinySpm::byte(0xE6), TinySpm::byte(0x97),
                 TinySpm::byte(0xA5)}));
  EXPECT_EQ(tok.encode("c\xC3\xA9", false),
            (Ids{spm["\xE2\x96\x81"], TinySpm::byte('c'), spm["\xC3\xA9"]}));
  EXPECT_EQ(tok.token_bytes(TinySpm::byte(0xE6)), "\xE6");
  EXPECT_EQ(tok.token_bytes(spm["\xE2\x96\x81world"]), " world");
  EXPECT_EQ(tok.token_bytes(1), "");
  for (const std::string text : {"hello world", "caf\xC3\xA9  \xE6\x97\xA5\xE6\x9C\xAC", "emoji \xF0\x9F\x99\x82!",
                                 " leading space", "trailing\n"}) {
    // The prefix space that encoding adds is dropped again, after BOS or not.
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text);
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  }
}

TEST(TokenizerSpm, SpecialTokensAndPrefixSpace) {
  const TinySpm spm;
  const Tokenizer tok = spm.meta.load();
  // As in llama.cpp, text after a special token gets the prefix space again.
  EXPECT_EQ(tok.encode("hello</s>world", false),
            (Ids{spm["\xE2\x96\x81hello"], 2, spm["\xE2\x96\x81world"]}));
  EXPECT_TRUE(tok.is_end_of_generation(2));
  EXPECT_FALSE(tok.is_end_of_generation(1));
}

TEST(TokenizerSpm, WithoutPrefixSpace) {
  TinySpm spm;
  spm.meta.add_space_prefix = false;
  spm.meta.add_bos = false;
  const Tokenizer tok = spm.meta.load();
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.encode("hello", true), (Ids{1, spm["he"], spm["llo"]}));
  EXPECT_EQ(tok.decode({spm["\xE2\x96\x81world"]}), " world");
}

TEST(TokenizerTextStream, HoldsBackSplitCharacters) {
  TinyBpe bpe;
  bpe.merge("a", "\xE6");
  const Tokenizer tok = bpe.meta.load();
  TokenTextStream stream(tok);
  // "a" + the first byte of 日 arrive in one token; the rest byte by byte.
  EXPECT_EQ(stream.push(tok.find_piece(mapped("a\xE6"))), "a");
  EXPECT_EQ(stream.push(0x97), "");
  EXPECT_EQ(stream.push(0xA5), "\xE6\x97\xA5");
  EXPECT_EQ(stream.push(bpe.im_end), "");
  EXPECT_EQ(stream.push(0xF0), "");
  EXPECT_EQ(stream.push(0x9F), "");
  EXPECT_EQ(stream.push(0x99), "");
  EXPECT_EQ(stream.push(0x82), "\xF0\x9F\x99\x82");
  EXPECT_EQ(stream.flush(), "");
}

TEST(TokenizerTextStream, ReplacesInvalidBytes) {
  TinyBpe bpe;
  const Tokenizer tok = bpe.meta.load();
  const std::string replacement = "\xEF\xBF\xBD";
  TokenTextStream stream(tok);
  EXPECT_EQ(stream.push(0xFF), replacement);  // can never start a character
  EXPECT_EQ(stream.push(0xE6), "");
  EXPECT_EQ(stream.push('x'), replacement + "x");  // 日's lead byte broken off
  EXPECT_EQ(stream.push(0xE6), "");
  EXPECT_EQ(stream.push(0x97), "");
  EXPECT_EQ(stream.flush(), replacement);  // cut short at the end
  EXPECT_EQ(stream.flush(), "");
}

TEST(TokenizerTextStream, MatchesDecode) {
  const TinySpm spm;
  const Tokenizer tok = spm.meta.load();
  const std::string text = "hello \xE6\x97\xA5 world \xF0\x9F\x99\x82";
  for (bool bos : {true, false}) {
    const Ids ids = tok.encode(text, bos);
    TokenTextStream stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, tok.decode(ids));
    EXPECT_EQ(streamed, text);
  }
}

// Loading errors name the file and the key.
void expect_load_error(const TokenizerMetadata& meta, const std::string& name, const std::string& needle) {
  const std::string path = meta.write(name);
  const GGUFFile file(path);
  try {
    Tokenizer::from_gguf(file);
    ADD_FAILURE() << name << ": no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

TEST(TokenizerLoad, RejectsBadMetadata) {
  TinyBpe base;
  base.merge("a", "b");

  TokenizerMetadata no_tokens = base.meta;
  no_tokens.tokens.clear();
  expect_load_error(no_tokens, "no_tokens", "tokenizer.ggml.tokens");

  TokenizerMetadata unknown_model = base.meta;
  unknown_model.model = "wordpiece";
  expect_load_error(unknown_model, "unknown_model", "tokenizer.ggml.model");

  TokenizerMetadata unknown_pre = base.meta;
  unknown_pre.pre = "klingon";
  expect_load_error(unknown_pre, "unknown_pre", "tokenizer.ggml.pre");

  TokenizerMetadata short_types = base.meta;
  short_types.types.pop_back();
  expect_load_error(short_types, "short_types", "tokenizer.ggml.token_type");

  TokenizerMetadata bad_type = base.meta;
  bad_type.types[5] = 9;
  expect_load_error(bad_type, "bad_type", "tokenizer.ggml.token_type[5]");

  TokenizerMetadata bad_merge = base.meta;
  bad_merge.merges.push_back("nospace");
  expect_load_error(bad_merge, "bad_merge", "tokenizer.ggml.merges[1]");

  TokenizerMetadata foreign_merge = base.meta;
  foreign_merge.merges.push_back("x yz");
  expect_load_error(foreign_merge, "foreign_merge", "tokenizer.ggml.merges[1]");

  TokenizerMetadata bad_bos = base.meta;
  bad_bos.ids["bos"] = 100000;
  expect_load_error(bad_bos, "bad_bos", "tokenizer.ggml.bos_token_id");

  TinySpm spm;
  spm.meta.scores.pop_back();
  expect_load_error(spm.meta, "short_scores", "tokenizer.ggml.scores");
}

// ---- Real vocabularies (skipped when the files are absent) ----

using ::kvserve::test_util::model_dir;

std::optional<std::string> find_model_file(const std::string& name) {
  for (const std::string& dir : {model_dir(), ::kvserve::test_util::shared_models_dir()}) {
    if (std::filesystem::exists(dir + "/" + name)) return dir + "/" + name;
  }
  return std::nullopt;
}

class TokenizerSmolLM2 : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto path = find_model_file("smollm2-135m-instruct-q4_1.gguf");
    if (!path) return;
    const GGUFFile file(*path);
    tok_ = new Tokenizer(Tokenizer::from_gguf(file));
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "smollm2-135m-instruct-q4_1.gguf not found in " << model_dir();
  }
  static const Tokenizer* tok_;
};
const Tokenizer* TokenizerSmolLM2::tok_ = nullptr;

TEST_F(TokenizerSmolLM2, Metadata) {
  EXPECT_EQ(tok_->kind(), VocabKind::kBytePairGpt2);
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->find_piece("<|im_start|>"), 1);
  EXPECT_TRUE(tok_->is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(tok_->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_end_of_generation(1));
  EXPECT_EQ(tok_->token_bytes(1), "");
}

// Ids from tools/tokenizer_reference.py bpe: Hugging Face `tokenizers` 0.23
// built from this file's vocabulary and merges with SmolLM2's pre-tokenizer
// (individual digits, then GPT-2 byte-level), special tokens added.
TEST_F(TokenizerSmolLM2, MatchesHuggingFaceIds) {
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Hello, world! This is a simple English sentence.", {19556, 28, 905, 17, 669, 314, 253, 2232, 2321, 6330, 30}},
      {"def add(a, b):\n    return a + b\n", {1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198}},
      {"12345 apples cost $6.78", {33, 34, 35, 36, 37, 13855, 1708, 1885, 38, 30, 39, 40}},
      {"I'm sure they'll say it's fine, we've done what we'd planned. DON'T",
       {57, 5248, 2090, 502, 3060, 1643, 357, 506, 4979, 28, 392, 3543, 2294, 732, 392, 6737, 8176, 30, 422, 2154, 23,
        68}},
      {"Multiple   spaces\n\n\nand\ttabs  \n end", {28421, 256, 5600, 1116, 198, 397, 197, 100, 7366, 32057, 1112}},
      {"Caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "
       "\xF0\x9F\x99\x82",
       {51, 1939, 2756, 15486, 46494, 17097, 241, 115, 40993, 179, 120, 248, 5470, 249, 46879, 16464, 32547, 47526}},
      {"<|im_start|>user\nHi<|im_end|>", {1, 4093, 198, 26843, 2}},
      {"  leading and trailing  ", {216, 2899, 284, 35079, 256}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok_->encode(text, false), ids) << text;
    EXPECT_EQ(tok_->decode(ids), text.starts_with("<|") ? "user\nHi" : text);
  }
}

// More texts, same source, stored as tests/data/tokenizer_smollm2_reference.json.
TEST_F(TokenizerSmolLM2, MatchesHuggingFaceFixture) {
  std::ifstream in(KVSERVE_SOURCE_DIR "/tests/data/tokenizer_smollm2_reference.json");
  ASSERT_TRUE(in) << "missing tests/data/tokenizer_smollm2_reference.json";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  ASSERT_GT(fixture.at("cases").size(), 20u);
  for (const auto& c : fixture.at("cases")) {
    const std::string text = c.at("text");
    EXPECT_EQ(tok_->encode(text, false), c.at("ids").get<Ids>()) << nlohmann::json(text).dump();
  }
}

TEST_F(TokenizerSmolLM2, LongTextRoundTrips) {
  std::string text;
  for (int i = 0; i < 400; ++i) {
    text += "Paragraph " + std::to_string(i) + ": the model's tokenizer handles caf\xC3\xA9, \xE6\x97\xA5\xE6\x9C\xAC and " +
            "code like `x += y[i] * 2;`\n\n";
  }
  text += std::string(5000, ' ') + std::string(3000, 'a') + "\n";
  const Ids ids = tok_->encode(text, true);
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_EQ(tok_->decode(ids), text);
  TokenTextStream stream(*tok_);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  EXPECT_EQ(streamed + stream.flush(), text);
}

// tok512.bin is a llama2.c tokenizer (see /work/shared/models/README.md):
// rewritten here as GGUF SentencePiece metadata.
TokenizerMetadata read_llama2c_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t max_length = 0;
  in.read(reinterpret_cast<char*>(&max_length), 4);
  TokenizerMetadata meta;
  meta.model = "llama";
  float score = 0;
  int32_t length = 0;
  while (in.read(reinterpret_cast<char*>(&score), 4) && in.read(reinterpret_cast<char*>(&length), 4)) {
    std::string piece(static_cast<size_t>(length), '\0');
    in.read(piece.data(), length);
    const auto id = static_cast<int32_t>(meta.tokens.size());
    int32_t type = 1;
    if (id == 0) {
      type = 2;
    } else if (id <= 2) {
      type = 3;
      piece = id == 1 ? "<s>" : "</s>";  // stored as "\n<s>\n", "\n</s>\n"
    } else if (id <= 258) {
      type = 6;
    } else {
      piece = spm_escape_spaces(piece);  // the exporter had turned "▁" into " "
    }
    meta.add(piece, type, score);
  }
  return meta;
}

// Ids from tools/tokenizer_reference.py spm: a Python re-implementation of
// llama2.c's encode() (dummy-prefix space, then greedy highest-score merges).
TEST(TokenizerTok512, MatchesLlama2cEncode) {
  const auto path = find_model_file("tok512.bin");
  if (!path) GTEST_SKIP() << "tok512.bin not found in " << model_dir();
  const TokenizerMetadata meta = read_llama2c_tokenizer(*path);
  ASSERT_EQ(meta.tokens.size(), 512u);
  const Tokenizer tok = meta.load();
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"Once upon a time", {403, 407, 261, 378}},
      {"The little girl saw a big, red ball.", {291, 376, 298, 315, 421, 394, 261, 370, 432, 352, 266, 268, 388, 426}},
      {"Lily \xE6\x97\xA5", {317, 410, 233, 154, 168}},
      {"hello  world", {281, 306, 414, 410, 263, 304, 341}},
  };
  for (const auto& [text, ids] : cases) {
    Ids with_bos = ids;
    with_bos.insert(with_bos.begin(), 1);
    EXPECT_EQ(tok.encode(text, true), with_bos) << text;
    EXPECT_EQ(tok.decode(with_bos), text);
  }
}

}  // namespace
}  // namespace kvserve
