#include "server/anthropic_encoder.h"

#include "server/anthropic_messages.h"
#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

// Anthropic's tool_use ids read "toolu_...".
std::string tool_use_id(const std::string& call_id) { return call_id_as("toolu_", call_id); }

// The call's arguments as an object (they are compact JSON by construction).
json tool_input(const ToolCall& call) {
  std::optional<json> input = parse_bounded_json<json>(call.arguments);
  return input && input->is_object() ? *input : json::object();
}

json usage_json(int64_t prompt_tokens, int64_t cached_tokens, int64_t output_tokens) {
  // Anthropic counts cache reads apart: input + cache_read + cache_creation is the whole prompt.
  return {{"input_tokens", prompt_tokens - cached_tokens}, {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached_tokens}, {"output_tokens", output_tokens}};
}

}  // namespace

AnthropicEncoder::AnthropicEncoder(const ParsedRequest& request, std::string model_id)
    : syntax_(chat_output_syntax(request)),
      output_(syntax_),
      id_(unique_id("msg_")),
      model_(std::move(model_id)),
      prompt_tokens_(static_cast<int64_t>(request.requests.at(0).request().prompt.size())) {}

std::string AnthropicEncoder::stop_reason(const std::string& finish_reason, const std::string& stop_sequence,
                                          bool called) const {
  if (called) return "tool_use";
  if (finish_reason == "length") return "max_tokens";
  return stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json AnthropicEncoder::whole(const std::vector<ChoiceResult>& choices) {
  const ChoiceResult& r = choices.at(0);
  ChatOutputStream stream(syntax_);
  const ChatDelta delta = stream.feed(r.text, true);
  json content = json::array();
  if (!delta.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", delta.reasoning}, {"signature", ""}});
  if (!delta.content.empty()) content.push_back({{"type", "text"}, {"text", delta.content}});
  const std::vector<ToolCall> calls = delta.whole_calls();
  for (const ToolCall& call : calls)
    content.push_back({{"type", "tool_use"}, {"id", tool_use_id(call.id)}, {"name", call.name}, {"input", tool_input(call)}});
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", std::move(content)},
          {"stop_reason", stop_reason(r.finish_reason, r.stop_sequence, !calls.empty())},
          {"stop_sequence", r.stop_sequence.empty() ? json(nullptr) : json(r.stop_sequence)},
          {"usage", usage_json(r.prompt_tokens, r.cached_tokens, r.completion_tokens)}};
}

std::string AnthropicEncoder::stream_start() {
  const json message = {{"id", id_},           {"type", "message"},         {"role", "assistant"},
                        {"model", model_},     {"content", json::array()},  {"stop_reason", nullptr},
                        {"stop_sequence", nullptr}, {"usage", usage_json(prompt_tokens_, 0, 0)}};
  return sse_event({{"type", "message_start"}, {"message", message}}, "message_start") +
         sse_event({{"type", "ping"}}, "ping");
}

std::string AnthropicEncoder::open_block(Block block) {
  if (open_ == block) return "";
  std::string out = close_block();
  const json start = block == Block::kThinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                               : json{{"type", "text"}, {"text", ""}};
  out += sse_event({{"type", "content_block_start"}, {"index", next_index_}, {"content_block", start}},
                   "content_block_start");
  open_ = block;
  return out;
}

std::string AnthropicEncoder::close_block() {
  if (open_ == Block::kNone) return "";
  open_ = Block::kNone;
  return sse_event({{"type", "content_block_stop"}, {"index", next_index_++}}, "content_block_stop");
}

// Each call is a block of its own, opened by its first piece, its input
// streamed as input_json_delta pieces, closed by its last.
std::string AnthropicEncoder::tool_use_blocks(const std::vector<ToolCallDelta>& pieces) {
  std::string out;
  for (const ToolCallDelta& piece : pieces) {
    if (piece.first) {
      out += close_block();
      const json start = {{"type", "tool_use"}, {"id", tool_use_id(piece.id)},
                          {"name", piece.name}, {"input", json::object()}};
      out += sse_event({{"type", "content_block_start"}, {"index", next_index_}, {"content_block", start}},
                       "content_block_start");
      open_ = Block::kToolUse;
    }
    if (!piece.arguments.empty())
      out += sse_event({{"type", "content_block_delta"}, {"index", next_index_},
                        {"delta", {{"type", "input_json_delta"}, {"partial_json", piece.arguments}}}},
                       "content_block_delta");
    if (piece.last) out += close_block();
  }
  return out;
}

std::string AnthropicEncoder::stream_event(const ChoiceEvent& event) {
  const GenerationEvent& e = event.event;
  cached_tokens_ = e.cached_tokens;
  output_tokens_ = e.completion_tokens;
  if (e.finished && (e.finish_reason == "error" || e.finish_reason == "cancelled")) {
    failed_ = true;
    const bool cancelled = e.finish_reason == "cancelled";
    const json error = {{"type", cancelled ? "overloaded_error" : "api_error"},
                        {"message", cancelled ? "the request was cancelled (the server is shutting down)" : e.error}};
    return sse_event({{"type", "error"}, {"error", error}}, "error");
  }
  const ChatDelta delta = output_.feed(e.text, e.finished);
  if (e.finished) {
    finish_reason_ = e.finish_reason;
    stop_sequence_ = e.stop_sequence;
  }
  std::string out;
  if (!delta.reasoning.empty())
    out += open_block(Block::kThinking) +
           sse_event({{"type", "content_block_delta"}, {"index", next_index_},
                      {"delta", {{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}},
                     "content_block_delta");
  if (!delta.content.empty())
    out += open_block(Block::kText) +
           sse_event({{"type", "content_block_delta"}, {"index", next_index_},
                      {"delta", {{"type", "text_delta"}, {"text", delta.content}}}},
                     "content_block_delta");
  out += tool_use_blocks(delta.calls);
  if (e.finished) out += close_block();
  return out;
}

std::string AnthropicEncoder::stream_end() {
  if (failed_) return "";
  const std::string reason = stop_reason(finish_reason_, stop_sequence_, output_.calls_so_far() > 0);
  const json delta = {{"stop_reason", reason},
                      {"stop_sequence", stop_sequence_.empty() ? json(nullptr) : json(stop_sequence_)}};
  return sse_event({{"type", "message_delta"}, {"delta", delta},
                    {"usage", usage_json(prompt_tokens_, cached_tokens_, output_tokens_)}},
                   "message_delta") +
         sse_event({{"type", "message_stop"}}, "message_stop");
}

}  // namespace kvserve::server
