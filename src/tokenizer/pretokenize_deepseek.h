#pragma once
// The DeepSeek pre-tokenizers (pretokenize_deepseek.cpp): llama.cpp's regex
// lists for DeepSeek-LLM / V2, DeepSeek-V3 / R1 and DeepSeek-Coder, each
// applied as a chain of splits.
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace kvserve {

// kind is kDeepSeekLlm, kDeepSeekV3 or kDeepSeekCoder; [begin, end) byte
// ranges that tile the decoded text.
std::vector<ByteSpan> pre_tokenize_deepseek(const std::vector<Utf8Char>& chars, PreTokenizer kind);

}  // namespace kvserve
