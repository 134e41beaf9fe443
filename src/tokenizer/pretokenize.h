#pragma once
// Byte-level BPE pre-tokenizers: the splitting regexes of GPT-2, Llama 3,
// Qwen2 and DeepSeek, matched by hand on decoded characters instead of with a
// regex engine. Each returns [begin, end) byte ranges that tile the input.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvserve {

enum class PreTokenizer {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // Every digit split off on its own first (\p{N}), then the GPT-2 pattern:
  // SmolLM, StarCoder.
  kGpt2SplitDigits,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
  //   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As Llama 3, but numbers split into single digits (\p{N}).
  kQwen2,
  // DeepSeek's lists of regexes, each splitting the pieces the previous one
  // left (pretokenize_deepseek.cpp):
  // DeepSeek-LLM, V2, V2-Lite ("deepseek-llm"): [\r\n], \s?[Latin, Greek,
  // Cyrillic... letters]+, \s?[ASCII/fullwidth punctuation]+, \s+$,
  // [CJK ranges]+, \p{N}+
  kDeepSeekLlm,
  // DeepSeek-V3, R1 ("deepseek-v3"): \p{N}{1,3}, [CJK and kana]+, then a
  // Llama 3-like words regex over \p{L}\p{M} / \p{P}\p{S}
  kDeepSeekV3,
  // DeepSeek-Coder ("deepseek-coder"): [\r\n], \s?\p{L}+, \s?\p{P}+,
  // [CJK ranges]+, \p{N}
  kDeepSeekCoder,
};

// Maps tokenizer.ggml.pre to a pre-tokenizer; nullopt for a name we do not know.
std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name);
// The accepted names, for error messages.
std::string known_pre_tokenizer_names();

using ByteSpan = std::pair<uint32_t, uint32_t>;
std::vector<ByteSpan> pre_tokenize(std::string_view text, PreTokenizer kind);

}  // namespace kvserve
