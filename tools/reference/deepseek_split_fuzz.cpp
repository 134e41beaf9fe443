// Differential fuzz: kvserve's DeepSeek pre_tokenize() against libllama's
// own unicode_regex_split() (the regex lists read from the splits fixture) on
// random strings drawn from ASCII, whitespace of every kind and code points
// at the edges of the DeepSeek ranges and classes (all assigned by Unicode 14,
// kvserve's tables; llama.cpp's are newer). Prints the first mismatches.
//
//   B=/path/to/llama.cpp/build/bin   # libllama.so
//   g++ -std=c++20 -O1 -Isrc tools/reference/deepseek_split_fuzz.cpp -o /tmp/deepseek_split_fuzz \
//       -Wl,--start-group build/libkvserve_*.a -Wl,--end-group -L$B -lllama -Wl,-rpath,$B -fopenmp
//   /tmp/deepseek_split_fuzz tests/data/deepseek_pretokenizer_splits.json 20000
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

// llama.cpp src/unicode.h
std::vector<std::string> unicode_regex_split(const std::string& text, const std::vector<std::string>& regex_exprs,
                                             bool byte_encode);

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SPLITS_JSON ROUNDS\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  const auto data = nlohmann::json::parse(in);
  const int rounds = std::stoi(argv[2]);
  // pool of code points: ASCII all printable + controls, and chosen non-ASCII
  std::vector<uint32_t> pool;
  for (uint32_t c = 0x01; c < 0x80; ++c) pool.push_back(c);
  const uint32_t extra[] = {
      0x85,   0xA0,   0xB5,    0xAA,    0xBA,    0xC0,    0xD7,    0xE9,    0xF7,    0xFF,    0x1BB,   0x1C5,
      0x294,  0x2B0,  0x2C6,   0x300,   0x301,   0x308,   0x374,   0x37E,   0x386,   0x387,   0x3A9,   0x3B1,
      0x3F6,  0x410,  0x451,   0x482,   0x483,   0x531,   0x561,   0x589,   0x5D0,   0x5BE,   0x627,   0x660,
      0x6F0,  0x64B,  0x800,   0x905,   0x93F,   0x966,   0xE01,   0xE31,   0xE50,   0x10A0,  0x10D0,  0x10FB,
      0x1100, 0x13A0, 0x13F8,  0x1680,  0x180E,  0x1C90,  0x1D00,  0x1D2C,  0x1E00,  0x1F00,  0x1FBE,  0x1FBD,
      0x1FD3, 0x2000, 0x2003,  0x200B,  0x200D,  0x2018,  0x201C,  0x2020,  0x2026,  0x2028,  0x2029,  0x202F,
      0x205F, 0x20AC, 0x2102,  0x2126,  0x212A,  0x2160,  0x2183,  0x2190,  0x2460,  0x2C00,  0x3000,  0x3001,
      0x3002, 0x3003, 0x300C,  0x3041,  0x309B,  0x30A0,  0x30A2,  0x30FB,  0x30FC,  0x3105,  0x3131,  0x4E00,
      0x4E2D, 0x9FA5, 0x9FA6,  0xA640,  0xA722,  0xAB70,  0xAC00,  0xD55C,  0xD7A3,  0xD7B0,  0xD7FF,  0xE000,
      0xF900, 0xFB01, 0xFE30,  0xFEFF,  0xFF01,  0xFF0C,  0xFF10,  0xFF21,  0xFF41,  0xFF5E,  0xFF5F,  0xFF61,
      0xFF66, 0xFFFD, 0x10400, 0x104B0, 0x10C80, 0x118A0, 0x1D400, 0x1E900, 0x1F44D, 0x1F3FD, 0x1F600, 0x20000};
  for (uint32_t c : extra) pool.push_back(c);
  std::mt19937 rng(12345);
  const char* names[] = {"deepseek-llm", "deepseek-v3", "deepseek-coder"};
  const kvserve::PreTokenizer kinds[] = {kvserve::PreTokenizer::kDeepSeekLlm, kvserve::PreTokenizer::kDeepSeekV3,
                                         kvserve::PreTokenizer::kDeepSeekCoder};
  long bad = 0, pieces = 0;
  for (int r = 0; r < rounds; ++r) {
    std::string text;
    const int n = 1 + rng() % 24;
    for (int k = 0; k < n; ++k) {
      uint32_t cp;
      switch (rng() % 4) {
        case 0:
          cp = " \n\r\t"[rng() % 4];
          break;
        case 1:
          cp = pool[rng() % 95];
          break;  // ASCII
        default:
          cp = pool[rng() % pool.size()];
      }
      const int rep = rng() % 5 == 0 ? 1 + rng() % 4 : 1;
      for (int q = 0; q < rep; ++q) kvserve::append_utf8(text, cp);
    }
    for (int k = 0; k < 3; ++k) {
      const auto want =
          unicode_regex_split(text, data.at("regexes").at(names[k]).get<std::vector<std::string>>(), false);
      std::vector<std::string> got;
      for (auto [b, e] : kvserve::pre_tokenize(text, kinds[k])) got.push_back(text.substr(b, e - b));
      pieces += want.size();
      if (got != want) {
        if (++bad <= 10)
          std::printf("MISMATCH %s %s\n  llama.cpp %s\n  kvserve   %s\n", names[k], nlohmann::json(text).dump().c_str(),
                      nlohmann::json(want).dump().c_str(), nlohmann::json(got).dump().c_str());
      }
    }
  }
  std::printf("%d texts x 3, %ld llama.cpp pieces, %ld mismatches\n", rounds, pieces, bad);
  return bad == 0 ? 0 : 1;
}
