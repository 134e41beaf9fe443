#pragma once
// Fill-in-the-middle prompts for code models (Qwen2.5-Coder, CodeLlama,
// DeepSeek-Coder, StarCoder): the code before and after the cursor, and other
// files of the project, laid out as llama-server's /infill lays them out
// (format_prompt_infill), so that both servers feed a model the same tokens:
//
//   [FIM_REP]myproject\n [FIM_SEP]name\n text ... [FIM_SEP]filename\n
//   [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]
//
// (without repository tokens, each extra file follows "\n\n--- snippet ---\n\n").
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvserve::server {

struct InfillInput {
  std::string prefix;  // before the cursor
  std::string suffix;  // after it
  std::string prompt;  // the start of the middle, after the prefix (may hold special tokens)
  struct File {
    std::string filename = "tmp";
    std::string text;
  };
  std::vector<File> extra;  // other files, most relevant last
};

// The prompt's tokens. As llama-server does with its defaults: the prefix
// keeps its last 3/4 x n_batch tokens, the suffix its first n_batch/4 - 2 -
// (prompt tokens), and the extra files the last n_ctx - n_batch - 2 x
// n_predict tokens of theirs (n_predict -1: no limit). Throws kvserve::Error
// when the vocabulary has no FIM tokens.
std::vector<int32_t> infill_prompt(const Tokenizer& tokenizer, const InfillInput& input, int64_t n_batch,
                                   int64_t n_predict, int64_t n_ctx);

// llama-server's n_batch default, which its /infill layout depends on.
constexpr int64_t kInfillBatch = 2048;

}  // namespace kvserve::server
