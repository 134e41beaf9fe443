// The DeepSeek pre-tokenizers ("deepseek-llm", "deepseek-v3",
// "deepseek-coder") against two recorded references:
//  - tests/data/deepseek_pretokenizer_splits.json: the pieces of a corpus of
//    tricky texts from Python's `regex` module applying llama.cpp's regex
//    lists in llama.cpp's chained-split manner
//    (tools/reference/deepseek_pretokenizer_reference.py splits; checked
//    against libllama's own unicode_regex_split by
//    tools/reference/llama_cpp_split_probe.cpp);
//  - tests/data/deepseek_pretokenizer_llama_cpp_ids.json: llama.cpp's
//    llama-tokenize ids for the same texts on a synth GGUF (tiny-deepseek2,
//    with the 49152-token synth vocabulary of smollm2-135m, whose padding
//    merges join words to punctuation, digits and spaces) copied once per
//    tokenizer.ggml.pre value (... reference.py ids).
// Plus hostile input: invalid UTF-8 and long runs.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/synth.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {
namespace {

using DeepSeekPieces = std::vector<std::string>;

DeepSeekPieces deepseek_split(const std::string& text, PreTokenizer kind) {
  DeepSeekPieces pieces;
  for (const auto& [begin, end] : pre_tokenize(text, kind)) pieces.emplace_back(text.substr(begin, end - begin));
  return pieces;
}

nlohmann::json read_deepseek_fixture(const std::string& name) {
  std::ifstream in(std::string(KVSERVE_SOURCE_DIR "/tests/data/") + name);
  if (!in) throw std::runtime_error("missing tests/data/" + name);
  return nlohmann::json::parse(in);
}

PreTokenizer deepseek_kind(const std::string& name) {
  const auto kind = pre_tokenizer_from_name(name);
  if (!kind) throw std::runtime_error("unknown pre-tokenizer " + name);
  return *kind;
}

TEST(DeepSeekPretokenizer, NamesMapToKinds) {
  EXPECT_EQ(pre_tokenizer_from_name("deepseek-llm"), PreTokenizer::kDeepSeekLlm);
  EXPECT_EQ(pre_tokenizer_from_name("deepseek-v3"), PreTokenizer::kDeepSeekV3);
  EXPECT_EQ(pre_tokenizer_from_name("deepseek-coder"), PreTokenizer::kDeepSeekCoder);
  EXPECT_NE(known_pre_tokenizer_names().find("deepseek-v3"), std::string::npos);
}

// A few cases spelled out, to read alongside the regex lists.
TEST(DeepSeekPretokenizer, HandPicked) {
  const std::string text = "Hello, world! 12345 \xE4\xB8\xAD\xE6\x96\x87\xEF\xBC\x8C  \n\n end  ";  // 中文，
  EXPECT_EQ(deepseek_split(text, PreTokenizer::kDeepSeekLlm),
            (DeepSeekPieces{"Hello", ",", " world", "!", " ", "12345", " ", "\xE4\xB8\xAD\xE6\x96\x87",
                            "\xEF\xBC\x8C", "  ", "\n", "\n", " end", "  "}));
  EXPECT_EQ(deepseek_split(text, PreTokenizer::kDeepSeekV3),
            (DeepSeekPieces{"Hello", ",", " world", "!", " ", "123", "45", " ", "\xE4\xB8\xAD\xE6\x96\x87",
                            "\xEF\xBC\x8C", "  \n\n", " end", "  "}));
  EXPECT_EQ(deepseek_split(text, PreTokenizer::kDeepSeekCoder),
            (DeepSeekPieces{"Hello", ",", " world", "!", " ", "1", "2", "3", "4", "5", " ",
                            "\xE4\xB8\xAD\xE6\x96\x87", "\xEF\xBC\x8C", "  ", "\n", "\n", " end", "  "}));
  // V3: ASCII punctuation takes an ASCII word along; U+3000 is whitespace, not
  // DeepSeek-LLM's [　-。] punctuation.
  EXPECT_EQ(deepseek_split("x.y_z 'll", PreTokenizer::kDeepSeekV3), (DeepSeekPieces{"x", ".y", "_z", " '", "ll"}));
  EXPECT_EQ(deepseek_split("\xE3\x80\x80x\xE3\x80\x81", PreTokenizer::kDeepSeekLlm),
            (DeepSeekPieces{"\xE3\x80\x80x", "\xE3\x80\x81"}));
  EXPECT_TRUE(pre_tokenize("", PreTokenizer::kDeepSeekV3).empty());
}

TEST(DeepSeekPretokenizer, MatchesRegexReferenceSplits) {
  const nlohmann::json fixture = read_deepseek_fixture("deepseek_pretokenizer_splits.json");
  size_t compared = 0;
  for (const auto& c : fixture.at("cases")) {
    const std::string text = c.at("text");
    for (const auto& [name, pieces] : c.at("pieces").items()) {
      EXPECT_EQ(deepseek_split(text, deepseek_kind(name)), pieces.get<DeepSeekPieces>())
          << name << " " << nlohmann::json(text).dump();
      ++compared;
    }
  }
  EXPECT_GE(compared, 180u);
}

// A synth vocabulary (build_synth_vocab, what `kvserve synth` writes)
// with tokenizer.ggml.pre set to `pre`.
Tokenizer deepseek_synth_tokenizer(const ByteBpeVocab& vocab, const std::string& pre) {
  GGUFWriter w;
  w.set_string("general.architecture", "deepseek2");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  w.set_string_array("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  const std::string path = testing::TempDir() + "kvserve_deepseek_pretok_" + pre + ".gguf";
  w.write(path);
  return Tokenizer::from_gguf(GGUFFile(path));
}

TEST(DeepSeekPretokenizer, MatchesLlamaCppIds) {
  const nlohmann::json fixture = read_deepseek_fixture("deepseek_pretokenizer_llama_cpp_ids.json");
  const ByteBpeVocab vocab = build_synth_vocab(fixture.at("vocab_size").get<int>());
  std::map<std::string, Tokenizer> tokenizers;
  size_t texts = 0, ids = 0;
  for (const auto& c : fixture.at("cases")) {
    const std::string text = c.at("text");
    for (const auto& [pre, expected] : c.at("ids").items()) {
      if (!tokenizers.count(pre)) tokenizers.emplace(pre, deepseek_synth_tokenizer(vocab, pre));
      const std::vector<int32_t> want = expected.get<std::vector<int32_t>>();
      EXPECT_EQ(tokenizers.at(pre).encode(text, false), want) << pre << " " << nlohmann::json(text).dump();
      ++texts;
      ids += want.size();
    }
  }
  EXPECT_EQ(tokenizers.size(), 3u);
  EXPECT_GE(texts, 170u);
  EXPECT_GT(ids, 1000u);
}

// Every piece non-empty and in order, tiling the whole text.
void expect_tiles(const std::string& text, PreTokenizer kind) {
  uint32_t pos = 0;
  for (const auto& [begin, end] : pre_tokenize(text, kind)) {
    ASSERT_EQ(begin, pos);
    ASSERT_GT(end, begin);
    pos = end;
  }
  ASSERT_EQ(pos, text.size());
}

constexpr PreTokenizer kDeepSeekKinds[] = {PreTokenizer::kDeepSeekLlm, PreTokenizer::kDeepSeekV3,
                                           PreTokenizer::kDeepSeekCoder};

TEST(DeepSeekPretokenizer, InvalidUtf8Tiles) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  const std::string pieces[] = {"\xE4\xB8", "\xC3", " ", "\n", "a", "1", "\xEF\xBC\x81", "\xF0\x9F", "\x80\x80", "'"};
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int n = 1 + round % 40;
    for (int k = 0; k < n; ++k) {
      if (byte(rng) < 128) {
        text += static_cast<char>(byte(rng));
      } else {
        text += pieces[byte(rng) % std::size(pieces)];
      }
    }
    for (PreTokenizer kind : kDeepSeekKinds) expect_tiles(text, kind);
  }
}

// Long runs of one class each, and alternations, stay linear: 200k
// characters in well under a second each even in a sanitizer build.
TEST(DeepSeekPretokenizer, LongRunsStayLinear) {
  const size_t n = 200000;
  const std::string runs[] = {
      std::string(n, ' ') + "x",
      std::string(n, ' '),
      std::string(n, ' ') + "\n" + std::string(n, ' ') + "!",
      "\n" + std::string(n, ' ') + "x",
      std::string(n, 'a'),
      std::string(n, '7'),
      std::string(n, '!'),
      std::string(n, '\n'),
      [&] { std::string s; while (s.size() < n) s += "\xE3\x80\x80"; return s + "x"; }(),  // U+3000
      [&] { std::string s; while (s.size() < n) s += "\xE4\xB8\xAD"; return s; }(),           // 中
      [&] { std::string s; while (s.size() < n) s += " a1!"; return s; }(),
      [&] { std::string s; while (s.size() < n) s += "\xCC\x81"; return s; }(),  // combining acute
      std::string(n, '\xFF'),
  };
  for (const std::string& text : runs) {
    for (PreTokenizer kind : kDeepSeekKinds) {
      const auto start = std::chrono::steady_clock::now();
      expect_tiles(text, kind);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(seconds, 2.0) << "kind " << static_cast<int>(kind) << ", text of " << text.size() << " bytes";
    }
  }
  // A whitespace run before text: one piece less its last space (V3), or
  // kept whole with the space leading the word (LLM, Coder).
  EXPECT_EQ(pre_tokenize(std::string(n, ' ') + "x", PreTokenizer::kDeepSeekV3).size(), 2u);
  EXPECT_EQ(pre_tokenize(std::string(n, ' ') + "x", PreTokenizer::kDeepSeekLlm).size(), 2u);
}

}  // namespace
}  // namespace kvserve
