// Checks tests/data/deepseek_pretokenizer_splits.json (written by
// deepseek_pretokenizer_reference.py) against llama.cpp's own splitter:
// libllama exports unicode_regex_split(), which llm_tokenizer_bpe calls with
// the pre-tokenizer's regex list. Prints each disagreement; exit status 1 if any.
//
//   B=/path/to/llama.cpp/build/bin
//   g++ -std=c++17 -O1 tools/reference/llama_cpp_split_probe.cpp -o /tmp/split_probe \
//       -L$B -lllama -Wl,-rpath,$B
//   /tmp/split_probe tests/data/deepseek_pretokenizer_splits.json
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

// llama.cpp src/unicode.h
std::vector<std::string> unicode_regex_split(const std::string& text, const std::vector<std::string>& regex_exprs,
                                             bool byte_encode);

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SPLITS_JSON\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  const nlohmann::json data = nlohmann::json::parse(in);
  size_t compared = 0, pieces = 0, bad = 0;
  for (const auto& c : data.at("cases")) {
    const std::string text = c.at("text");
    for (const auto& [name, expected] : c.at("pieces").items()) {
      const auto regexes = data.at("regexes").at(name).get<std::vector<std::string>>();
      const std::vector<std::string> got = text.empty() ? std::vector<std::string>{}
                                                        : unicode_regex_split(text, regexes, false);
      ++compared;
      pieces += got.size();
      if (got != expected.get<std::vector<std::string>>()) {
        ++bad;
        std::printf("MISMATCH %s %s\n  llama.cpp: %s\n  reference: %s\n", name.c_str(),
                    nlohmann::json(text).dump().c_str(), nlohmann::json(got).dump().c_str(), expected.dump().c_str());
      }
    }
  }
  std::printf("%zu splits compared (%zu llama.cpp pieces), %zu mismatches\n", compared, pieces, bad);
  return bad == 0 ? 0 : 1;
}
