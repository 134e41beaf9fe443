#pragma once
// llama-server's POST /infill request: input_prefix, input_suffix,
// input_extra ([{"filename", "text"}]) and prompt, with /completion's
// sampling fields (n_predict, temperature, top_k, top_p, min_p, seed, stop,
// repeat_penalty, ...), as the completions body that runs it: the FIM prompt's
// token ids and the same settings in OpenAI's names.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace kvserve::server {

// Throws ApiError 400 naming the field (or when the model has no FIM tokens).
// n_predict -1 (the default) generates until an end token or the context's end.
nlohmann::json completion_body_from_infill(const nlohmann::json& body, const Tokenizer& tokenizer, int64_t context);

}  // namespace kvserve::server
