#include "server/ollama_encoder.h"

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/rfc3339_time.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

int64_t nanoseconds_between(Clock::time_point from, Clock::time_point to) {
  if (from == Clock::time_point{} || to < from) return 0;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

json ollama_envelope(const std::string& model) {
  return {{"model", model}, {"created_at", rfc3339_utc(std::chrono::system_clock::now())}};
}

// A call as Ollama writes it: its arguments an object (they are compact JSON by construction).
json ollama_tool_call(const ToolCall& call, size_t index) {
  std::optional<json> arguments = parse_bounded_json<json>(call.arguments);
  return {{"id", call.id},
          {"function", {{"index", index}, {"name", call.name},
                        {"arguments", arguments && arguments->is_object() ? *arguments : json::object()}}}};
}

std::string ndjson_line(const json& value) { return dump_json(value) + "\n"; }

}  // namespace

OllamaEncoder::OllamaEncoder(const ParsedRequest& request, OllamaShape shape, std::string model_name,
                             Clock::time_point arrival, Clock::duration load)
    : syntax_(chat_output_syntax(request)),
      output_(syntax_),
      shape_(shape),
      model_(std::move(model_name)),
      arrival_(arrival),
      load_(load),
      prompt_tokens_(static_cast<int64_t>(request.requests.at(0).request().prompt.size())) {}

json OllamaEncoder::answer(const ChatDelta& parts, const std::vector<ToolCall>& calls, size_t first_call,
                           bool done) const {
  json out = ollama_envelope(model_);
  if (shape_ == OllamaShape::kGenerate) {
    out["response"] = parts.content;
    if (!parts.reasoning.empty()) out["thinking"] = parts.reasoning;
  } else {
    json message = {{"role", "assistant"}, {"content", parts.content}};
    if (!parts.reasoning.empty()) message["thinking"] = parts.reasoning;
    if (!calls.empty()) {
      message["tool_calls"] = json::array();
      for (const ToolCall& call : calls) message["tool_calls"].push_back(ollama_tool_call(call, first_call++));
    }
    out["message"] = std::move(message);
  }
  out["done"] = done;
  return out;
}

void OllamaEncoder::add_final_fields(json& out, const std::string& finish_reason, int64_t prompt_tokens,
                                     int64_t completion_tokens, Clock::time_point first_event_at,
                                     Clock::time_point finished_at) const {
  out["done_reason"] = finish_reason == "length" ? "length" : "stop";
  out["total_duration"] = nanoseconds_between(arrival_, finished_at);
  out["load_duration"] = nanoseconds_between(arrival_, arrival_ + load_);  // 0 for a one-model server's
  out["prompt_eval_count"] = prompt_tokens;
  out["prompt_eval_duration"] = nanoseconds_between(arrival_ + load_, first_event_at);
  out["eval_count"] = completion_tokens;
  out["eval_duration"] = nanoseconds_between(first_event_at, finished_at);
}

json OllamaEncoder::whole(const std::vector<ChoiceResult>& choices) {
  const ChoiceResult& r = choices.at(0);
  ChatOutputStream stream(syntax_);
  const ChatDelta parts = stream.feed(r.text, true);
  json out = answer(parts, parts.whole_calls(), 0, true);
  add_final_fields(out, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.first_event_at, r.finished_at);
  return out;
}

OllamaEncoder::CompletedCalls OllamaEncoder::completed_calls(const std::vector<ToolCallDelta>& pieces) {
  add_call_pieces(calls_, pieces);
  CompletedCalls out;
  for (const ToolCallDelta& piece : pieces) {
    if (!piece.last || piece.index >= calls_.size()) continue;
    if (out.calls.empty()) out.first = piece.index;  // calls complete in order: the next ones follow it
    out.calls.push_back(calls_[piece.index]);
  }
  return out;
}

std::string OllamaEncoder::stream_event(const ChoiceEvent& event) {
  const GenerationEvent& e = event.event;
  const Clock::time_point now = event.at == Clock::time_point{} ? Clock::now() : event.at;
  if (first_event_at_ == Clock::time_point{}) first_event_at_ = now;
  prompt_tokens_ = e.prompt_tokens;
  completion_tokens_ = e.completion_tokens;
  if (e.finished && (e.finish_reason == "error" || e.finish_reason == "cancelled")) {
    failed_ = true;
    const std::string message = e.finish_reason == "cancelled"
                                    ? "the request was cancelled (the server is shutting down)"
                                    : "generation failed: " + e.error;
    return ndjson_line({{"error", message}});
  }
  if (e.finished) {
    finished_at_ = now;
    finish_reason_ = e.finish_reason;
  }
  const ChatDelta delta = output_.feed(e.text, e.finished);
  const CompletedCalls completed = completed_calls(delta.calls);
  if (delta.content.empty() && delta.reasoning.empty() && completed.calls.empty()) return "";
  return ndjson_line(answer(delta, completed.calls, completed.first, false));
}

std::string OllamaEncoder::stream_end() {
  if (failed_) return "";
  json out = answer({}, {}, 0, true);
  add_final_fields(out, finish_reason_, prompt_tokens_, completion_tokens_, first_event_at_, finished_at_);
  return ndjson_line(out);
}

std::string OllamaEncoder::keep_alive() { return ndjson_line(answer({}, {}, 0, false)); }

json ollama_load_answer(OllamaShape shape, const std::string& model_name, const std::string& reason) {
  json out = ollama_envelope(model_name);
  if (shape == OllamaShape::kGenerate) out["response"] = "";
  else out["message"] = {{"role", "assistant"}, {"content", ""}};
  out["done"] = true;
  out["done_reason"] = reason;
  return out;
}

}  // namespace kvserve::server
