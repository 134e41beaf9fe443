// GGUF's tokenizer.ggml.token_type values (llama.cpp's llama_token_type), for
// the writers of GGUF vocabularies in this folder (the tokenizer reads them
// as its TokenType enum).
#pragma once

#include <cstdint>

namespace kvserve::gguf_token_type {

constexpr int32_t kNormal = 1;
constexpr int32_t kUnknown = 2;
constexpr int32_t kControl = 3;
constexpr int32_t kByte = 6;

}  // namespace kvserve::gguf_token_type
