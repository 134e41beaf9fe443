#pragma once
// The engine's events as Ollama's API writes an answer (/api/chat,
// /api/generate): one JSON object, or a stream of them, one per line
// (NDJSON): `done: false` chunks with the text as it comes, then a final
// `done: true` object with done_reason and the counts and durations
// (nanoseconds) Ollama reports; a failed generation ends the stream with an
// {"error": ...} line.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/response_encoder.h"

namespace kvserve::server {

// Where the answer goes: /api/chat's message {role, content, thinking,
// tool_calls}, or /api/generate's response and thinking.
enum class OllamaShape { kChat, kGenerate };

class OllamaEncoder : public ResponseEncoder {
 public:
  // One choice (Ollama has no n). `arrival`: when the request came, where its durations start. `load`: how long
  // it waited for its model (a load, or room for one, on a many-model server): load_duration, and not prompt time.
  OllamaEncoder(const ParsedRequest& request, OllamaShape shape, std::string model_name, Clock::time_point arrival,
                Clock::duration load = {});

  nlohmann::json whole(const std::vector<ChoiceResult>& choices) override;
  std::string stream_event(const ChoiceEvent& event) override;
  std::string stream_end() override;
  std::string keep_alive() override;  // a chunk with no text
  std::string content_type() const override { return "application/x-ndjson"; }

 private:
  // A chunk or answer: the text parts in the shape's place, the calls
  // numbered from first_call, `done` as given.
  nlohmann::json answer(const ChatDelta& parts, const std::vector<ToolCall>& calls, size_t first_call, bool done) const;
  // done_reason, the counts and the durations of a finished answer.
  void add_final_fields(nlohmann::json& out, const std::string& finish_reason, int64_t prompt_tokens,
                        int64_t completion_tokens, Clock::time_point first_event_at, Clock::time_point finished_at) const;
  // The calls the pieces of a stream completed (Ollama sends a call whole, once it is), and the first one's index.
  struct CompletedCalls {
    size_t first = 0;
    std::vector<ToolCall> calls;
  };
  CompletedCalls completed_calls(const std::vector<ToolCallDelta>& pieces);

  ChatOutputSyntax syntax_;
  ChatOutputStream output_;
  OllamaShape shape_;
  std::string model_;
  Clock::time_point arrival_;
  Clock::duration load_;
  // Streaming: the calls so far (pieces joined), and the counts, times and reason of the answer.
  std::vector<ToolCall> calls_;
  int64_t prompt_tokens_ = 0;
  int64_t completion_tokens_ = 0;
  Clock::time_point first_event_at_{};
  Clock::time_point finished_at_{};
  std::string finish_reason_;
  bool failed_ = false;  // an error line went out: the stream ends there
};

// The answer to a request with nothing to generate (chat without messages,
// generate without a prompt): `done: true` with done_reason "load" or
// "unload", as Ollama answers a request that only loads or unloads a model.
nlohmann::json ollama_load_answer(OllamaShape shape, const std::string& model_name, const std::string& reason);

}  // namespace kvserve::server
