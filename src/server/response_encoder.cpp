#include "server/response_encoder.h"

#include <atomic>
#include <chrono>

#include "server/api_error.h"

namespace kvserve::server {

using json = nlohmann::json;

void ChoiceResult::add(const GenerationEvent& event, Clock::time_point at) {
  if (first_event_at == Clock::time_point{}) first_event_at = at;
  if (event.finished) finished_at = at;
  text += event.text;
  logprobs.insert(logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  if (!event.prompt_logprobs.empty()) prompt_logprobs = event.prompt_logprobs;
  prompt_tokens = event.prompt_tokens;
  cached_tokens = event.cached_tokens;
  completion_tokens = event.completion_tokens;
  tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
  if (event.finished) finish_reason = event.finish_reason, error = event.error, stop_sequence = event.stop_sequence;
}

ChatOutputSyntax chat_output_syntax(const ParsedRequest& request) {
  ChatOutputSyntax out;
  if (request.endpoint != Endpoint::kChat) return out;
  out.reasoning = request.reasoning;
  out.starts_in_reasoning = request.reasoning_open;
  if (request.tools && request.tools->calls_allowed()) out.tools = request.tools;
  out.tool_format = request.tool_format;
  return out;
}

std::string sse_event(const json& data, const std::string& event_name) {
  return (event_name.empty() ? "" : "event: " + event_name + "\n") + "data: " + dump_json(data) + "\n\n";
}

std::string unique_id(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  const auto stamp = std::chrono::system_clock::now().time_since_epoch().count();
  return prefix + std::to_string(stamp % 1000000000) + "-" + std::to_string(++counter);
}

}  // namespace kvserve::server
