#pragma once
// The checks every GenerationRequest passes before it runs, in one place:
// Engine::submit applies them, and the HTTP server applies the same function
// to the requests it builds, so that both refuse the same requests with the
// same limits (the server answers a RequestError with a 400 naming its field).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"

namespace kvserve {

// The most likely alternatives a prompt token's logprob may come with (vLLM's max_logprobs).
constexpr int32_t kMaxPromptLogprobs = 20;

// Parallel samples (sequences) of one request at most.
inline constexpr int32_t kMaxSequences = 128;

// What a request is checked against; besides these, the stop strings' caps
// kMaxStopStrings and kMaxStopStringBytes (engine/stop_strings.h).
struct RequestLimits {
  int32_t vocab_size = 0;
  int64_t context = 0;  // tokens with K/V per sequence: a prompt must be shorter
  bool has_draft_model = false;

  bool operator==(const RequestLimits&) const = default;
};

// A request that can never run. param: the request field at fault, as the
// OpenAI API names it ("prompt", "max_tokens", "n", "stop", ...).
class RequestError : public Error {
 public:
  RequestError(std::string param, const std::string& message) : Error(message), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// Throws RequestError for a request that can never run: an empty or too long
// prompt, a token id outside the vocabulary, bad sampling parameters,
// max_tokens or min_tokens < 0, n outside [1, kMaxSequences], speculation the
// engine cannot run, stop strings past their caps.
void validate_request(const GenerationRequest& request, const RequestLimits& limits);
// A request that passed validate_request, with the limits it passed:
// Engine::submit_validated runs it without checking it again when those are
// the engine's own. The HTTP server validates while it parses (its 400s name
// the field, before any grammar compile), so a request is checked once.
class ValidatedRequest {
 public:
  // Throws RequestError (validate_request).
  ValidatedRequest(GenerationRequest request, const RequestLimits& limits)
      : request_(std::move(request)), limits_(limits) {
    validate_request(request_, limits_);
  }
  const GenerationRequest& request() const { return request_; }
  const RequestLimits& limits() const { return limits_; }
  // A compiled constraint is attached after validation: it is not one of the checks.
  void set_constraint(std::shared_ptr<const CompiledConstraint> constraint) { request_.constraint = std::move(constraint); }
  GenerationRequest take() && { return std::move(request_); }

 private:
  GenerationRequest request_;
  RequestLimits limits_;
};

// Its check of the stop strings alone (the server makes it before copying a
// request's settings to each of its prompts).
void validate_stop_strings(const std::vector<std::string>& stop);

}  // namespace kvserve
