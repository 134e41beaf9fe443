#pragma once
// What a generation request's answer is written as: one JSON body, or a
// Server-Sent Events stream. One encoder per API shape (OpenAI chat and
// completions, Anthropic Messages, OpenAI Responses), all over the same
// engine events; the HTTP side (generation_response.h) only moves bytes.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/chat_output.h"
#include "server/generation_job.h"
#include "server/request_parser.h"

namespace kvserve::server {

// Everything one choice produced, gathered from its events.
struct ChoiceResult {
  std::string text;
  std::vector<int32_t> tokens;  // the completion's
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // prompt positions 1.. (GenerationRequest::prompt_logprobs)
  std::string finish_reason;  // empty until the final event
  std::string stop_sequence;  // the stop string that ended it, if one did
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of which the prefix cache held
  int64_t completion_tokens = 0;
  // When the engine sent its first event (its prompt was computed, its first token sampled) and its final one.
  Clock::time_point first_event_at{};
  Clock::time_point finished_at{};

  void add(const GenerationEvent& event, Clock::time_point at = Clock::now());
};

class ResponseEncoder {
 public:
  virtual ~ResponseEncoder() = default;
  // The non-streaming body, once every choice has finished without error.
  virtual nlohmann::json whole(const std::vector<ChoiceResult>& choices) = 0;
  // The stream's bytes: before the first event, per engine event (a failed or
  // cancelled choice's final event says so in the API's error shape), and
  // after the last choice's final event.
  virtual std::string stream_start() { return ""; }
  virtual std::string stream_event(const ChoiceEvent& event) = 0;
  virtual std::string stream_end() = 0;
  // What an idle stream sends now and then, so that a client that left is
  // noticed while its request waits: an SSE comment, or a no-op chunk where
  // the stream is not SSE.
  virtual std::string keep_alive() { return ": keep-alive\n\n"; }
  virtual std::string content_type() const { return "text/event-stream"; }
};

// How a chat request's output is taken apart (reasoning, content, tool calls).
ChatOutputSyntax chat_output_syntax(const ParsedRequest& request);

// An id unique in this process: prefix + a time stamp + a counter.
std::string unique_id(const std::string& prefix);

// One Server-Sent Event: an optional `event:` line and its JSON `data:`.
std::string sse_event(const nlohmann::json& data, const std::string& event_name = "");

}  // namespace kvserve::server
