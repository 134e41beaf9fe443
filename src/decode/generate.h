#pragma once
// The single-sequence generation loop used by `kvserve run` and the tests:
// prefill the prompt, then sample / append one token at a time.
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "decode/decoder.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  bool stop_at_end_of_generation = true;  // stop on EOS / end-of-turn tokens
};

struct GenerateResult {
  std::vector<int32_t> tokens;    // generated ids (the stop token included when one ended it)
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;      // prefill time, up to the first logits
  double generate_seconds = 0;    // everything after, i.e. per generated token
  std::string finish_reason;      // "stop" (end-of-generation token or callback) or "length"
};

// on_token is called with each generated id; returning false stops generation.
// Throws kvserve::Error when the prompt is empty or exceeds the context.
GenerateResult generate(Decoder& decoder, Sampler& sampler, const Tokenizer& tokenizer,
                        std::span<const int32_t> prompt, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token);

}  // namespace kvserve
