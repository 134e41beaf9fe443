#include "engine/request_validation.h"

#include <cmath>

#include "speculation/request_speculation.h"
#include "engine/stop_strings.h"

namespace kvserve {
namespace {

// The field a sampling error is about: SamplingParams::validate's messages
// start with the parameter's name ("top_p must be in (0, 1], got 0").
std::string leading_name(const std::string& message, const char* fallback) {
  const size_t end = message.find_first_not_of("abcdefghijklmnopqrstuvwxyz_");
  return end == 0 || end == std::string::npos ? fallback : message.substr(0, end);
}

void check_prompt_tokens(const GenerationRequest& r, const RequestLimits& limits) {
  if (static_cast<int64_t>(r.prompt.size()) >= limits.context)
    throw RequestError("prompt", "the prompt has " + std::to_string(r.prompt.size()) + " tokens; the context size is " +
                                     std::to_string(limits.context) + " tokens");
  for (int32_t id : r.prompt)
    if (id < 0 || id >= limits.vocab_size)
      throw RequestError("prompt", "prompt token id " + std::to_string(id) + " is outside the vocabulary");
}

void check_sampling(const GenerationRequest& r, const RequestLimits& limits) {
  try {
    r.sampling.validate();
  } catch (const Error& e) {
    throw RequestError(leading_name(e.what(), "sampling"), e.what());
  }
  try {
    validate_speculation(r.speculation, limits.has_draft_model);
  } catch (const Error& e) {
    throw RequestError(r.speculation.mode == SpeculativeMode::kDraftModel && !limits.has_draft_model
                           ? "speculative.mode" : "speculative.draft_k", e.what());
  }
  for (const auto& [token, bias] : r.logit_bias)
    if (token < 0 || token >= limits.vocab_size || !std::isfinite(bias))
      throw RequestError("logit_bias", "logit_bias needs token ids in [0, " + std::to_string(limits.vocab_size) +
                                           ") and finite values");
  for (int32_t token : r.stop_token_ids)
    if (token < 0 || token >= limits.vocab_size)
      throw RequestError("stop_token_ids", "stop token id " + std::to_string(token) + " is outside the vocabulary");
}

}  // namespace

// In the order Engine::submit always checked, so that a request with several
// faults keeps getting the same message.
void validate_request(const GenerationRequest& r, const RequestLimits& limits) {
  if (r.prompt.empty()) throw RequestError("prompt", "the prompt is empty");
  if (r.max_tokens < 0) throw RequestError("max_tokens", "max_tokens must be >= 0, got " + std::to_string(r.max_tokens));
  if (r.n < 1 || r.n > kMaxSequences)
    throw RequestError("n", "n (parallel samples) must be in [1, " + std::to_string(kMaxSequences) + "], got " +
                                std::to_string(r.n));
  check_prompt_tokens(r, limits);
  check_sampling(r, limits);
  if (r.min_tokens < 0) throw RequestError("min_tokens", "min_tokens must be >= 0, got " + std::to_string(r.min_tokens));
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxPromptLogprobs)
    throw RequestError("prompt_logprobs", "prompt_logprobs must be in [0, " + std::to_string(kMaxPromptLogprobs) +
                                              "], got " + std::to_string(r.prompt_logprobs));
  validate_stop_strings(r.stop);
}

void validate_stop_strings(const std::vector<std::string>& stop) {
  if (stop.size() > kMaxStopStrings)
    throw RequestError("stop", "at most " + std::to_string(kMaxStopStrings) + " stop strings, got " +
                                   std::to_string(stop.size()));
  for (const std::string& s : stop)
    if (s.size() > kMaxStopStringBytes)
      throw RequestError("stop", "a stop string may be at most " + std::to_string(kMaxStopStringBytes) +
                                     " bytes, got one of " + std::to_string(s.size()));
}

}  // namespace kvserve
