#include "server/responses_encoder.h"

#include <chrono>

namespace kvserve::server {
namespace {

using json = nlohmann::json;

json output_text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

json reasoning_item(const std::string& id, const std::string& text, const char* status) {
  json content = json::array();
  if (!text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"type", "reasoning"}, {"id", id}, {"summary", json::array()}, {"content", content}, {"status", status}};
}

json message_item(const std::string& id, const std::string& text, const char* status) {
  json content = json::array();
  if (std::string(status) == "completed") content.push_back(output_text_part(text));
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

// A function_call item's id: "fc_" and the call's own characters.
std::string function_call_item_id(const ToolCall& call) { return call_id_as("fc_", call.id); }

json function_call_item(const ToolCall& call, const std::string& arguments, const char* status) {
  return {{"type", "function_call"}, {"id", function_call_item_id(call)},
          {"call_id", call.id}, {"name", call.name}, {"arguments", arguments}, {"status", status}};
}

}  // namespace

ResponsesEncoder::ResponsesEncoder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string model_id,
                                   json settings, Finished on_finished)
    : tokenizer_(tokenizer),
      syntax_(chat_output_syntax(request)),
      output_stream_(syntax_),
      id_(unique_id("resp_")),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      model_(std::move(model_id)),
      settings_(std::move(settings)),
      on_finished_(std::move(on_finished)),
      prompt_tokens_(static_cast<int64_t>(request.requests.at(0).request().prompt.size())) {
  if (syntax_.reasoning) reasoning_tokens_.emplace(*syntax_.reasoning, syntax_.starts_in_reasoning);
}

json ResponsesEncoder::response_object(const std::string& status) const {
  json out = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", status},
              {"error", nullptr}, {"incomplete_details", nullptr}, {"model", model_}, {"output", output_}};
  if (status == "incomplete") out["incomplete_details"] = {{"reason", "max_output_tokens"}};
  out.update(settings_);
  if (status != "in_progress")
    out["usage"] = {{"input_tokens", prompt_tokens_},
                    {"input_tokens_details", {{"cached_tokens", cached_tokens_}, {"cache_write_tokens", 0}}},
                    {"output_tokens", output_tokens_},
                    {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_ ? reasoning_tokens_->count() : 0}}},
                    {"total_tokens", prompt_tokens_ + output_tokens_}};
  return out;
}

std::string ResponsesEncoder::event(json data, const std::string& type) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return sse_event(data, type);
}

std::string ResponsesEncoder::open_item(Item kind) {
  if (open_ == kind) return "";
  std::string out = close_item();
  open_ = kind;
  open_id_ = unique_id(kind == Item::kReasoning ? "rs_" : "msg_");
  open_text_.clear();
  const int64_t index = static_cast<int64_t>(output_.size());
  const json item = kind == Item::kReasoning ? reasoning_item(open_id_, "", "in_progress")
                                             : message_item(open_id_, "", "in_progress");
  out += event({{"output_index", index}, {"item", item}}, "response.output_item.added");
  if (kind == Item::kMessage)
    out += event({{"item_id", open_id_}, {"output_index", index}, {"content_index", 0}, {"part", output_text_part("")}},
                 "response.content_part.added");
  return out;
}

std::string ResponsesEncoder::close_item() {
  if (open_ == Item::kNone) return "";
  const int64_t index = static_cast<int64_t>(output_.size());
  const json where = {{"item_id", open_id_}, {"output_index", index}, {"content_index", 0}};
  std::string out;
  json item;
  if (open_ == Item::kReasoning) {
    json done = where;
    done["text"] = open_text_;
    out += event(done, "response.reasoning_text.done");
    item = reasoning_item(open_id_, open_text_, "completed");
  } else {
    json done = where;
    done["text"] = open_text_;
    done["logprobs"] = json::array();
    out += event(done, "response.output_text.done");
    json part = where;
    part["part"] = output_text_part(open_text_);
    out += event(part, "response.content_part.done");
    item = message_item(open_id_, open_text_, "completed");
  }
  out += event({{"output_index", index}, {"item", item}}, "response.output_item.done");
  output_.push_back(std::move(item));
  open_ = Item::kNone;
  return out;
}

// A call's first piece opens its function_call item, its arguments stream
// as function_call_arguments.delta events, its last piece completes it.
std::string ResponsesEncoder::function_calls(const std::vector<ToolCallDelta>& pieces, bool streaming) {
  std::string out;
  for (const ToolCallDelta& piece : pieces) {
    const int64_t index = static_cast<int64_t>(output_.size());
    if (piece.first) {
      open_call_ = {piece.id, piece.name, ""};
      if (streaming) {
        out += close_item();
        out += event({{"output_index", index}, {"item", function_call_item(open_call_, "", "in_progress")}},
                     "response.output_item.added");
      }
    }
    open_call_.arguments += piece.arguments;
    const std::string item_id = function_call_item_id(open_call_);
    if (streaming && !piece.arguments.empty())
      out += event({{"item_id", item_id}, {"output_index", index}, {"delta", piece.arguments}},
                   "response.function_call_arguments.delta");
    if (!piece.last) continue;
    const json item = function_call_item(open_call_, open_call_.arguments, "completed");
    if (streaming) {
      out += event({{"item_id", item_id}, {"output_index", index}, {"name", open_call_.name},
                    {"arguments", open_call_.arguments}},
                   "response.function_call_arguments.done");
      out += event({{"output_index", index}, {"item", item}}, "response.output_item.done");
    }
    output_.push_back(item);
    if (!answer_.contains("tool_calls")) answer_["tool_calls"] = json::array();
    answer_["tool_calls"].push_back({{"id", open_call_.id}, {"type", "function"},
                                     {"function", {{"name", open_call_.name}, {"arguments", open_call_.arguments}}}});
  }
  return out;
}

// One piece of the answer: streamed as events, or (whole) gathered into items directly.
std::string ResponsesEncoder::take(const ChatDelta& delta, bool streaming) {
  std::string out;
  if (!delta.reasoning.empty()) {
    answer_["reasoning_content"] = answer_.value("reasoning_content", "") + delta.reasoning;
    if (streaming) {
      out += open_item(Item::kReasoning);
      out += event({{"item_id", open_id_}, {"output_index", output_.size()}, {"content_index", 0},
                    {"delta", delta.reasoning}},
                   "response.reasoning_text.delta");
      open_text_ += delta.reasoning;
    } else {
      output_.push_back(reasoning_item(unique_id("rs_"), delta.reasoning, "completed"));
    }
  }
  if (!delta.content.empty()) {
    answer_["content"] = answer_["content"].get<std::string>() + delta.content;
    if (streaming) {
      out += open_item(Item::kMessage);
      out += event({{"item_id", open_id_}, {"output_index", output_.size()}, {"content_index", 0},
                    {"delta", delta.content}, {"logprobs", json::array()}},
                   "response.output_text.delta");
      open_text_ += delta.content;
    } else {
      output_.push_back(message_item(unique_id("msg_"), delta.content, "completed"));
    }
  }
  return out + function_calls(delta.calls, streaming);
}

void ResponsesEncoder::count(const std::vector<int32_t>& tokens) {
  if (!reasoning_tokens_) return;
  for (int32_t id : tokens) reasoning_tokens_->add(tokenizer_.token_bytes(id));
}

void ResponsesEncoder::finish() {
  if (on_finished_) on_finished_(response_object(finish_reason_ == "length" ? "incomplete" : "completed"), answer_);
}

json ResponsesEncoder::whole(const std::vector<ChoiceResult>& choices) {
  const ChoiceResult& r = choices.at(0);
  take(output_stream_.feed(r.text, true), false);
  count(r.tokens);
  prompt_tokens_ = r.prompt_tokens;
  cached_tokens_ = r.cached_tokens;
  output_tokens_ = r.completion_tokens;
  finish_reason_ = r.finish_reason;
  finish();
  return response_object(finish_reason_ == "length" ? "incomplete" : "completed");
}

std::string ResponsesEncoder::stream_start() {
  const json response = response_object("in_progress");
  std::string out = event({{"response", response}}, "response.created");  // (two statements: numbered in order)
  return out + event({{"response", response}}, "response.in_progress");
}

std::string ResponsesEncoder::stream_event(const ChoiceEvent& ev) {
  const GenerationEvent& e = ev.event;
  prompt_tokens_ = e.prompt_tokens;
  cached_tokens_ = e.cached_tokens;
  output_tokens_ = e.completion_tokens;
  count(e.tokens);
  if (e.finished && (e.finish_reason == "error" || e.finish_reason == "cancelled")) {
    failed_ = true;
    json response = response_object("failed");
    const bool cancelled = e.finish_reason == "cancelled";
    response["error"] = {{"code", "server_error"},
                         {"message", cancelled ? "the request was cancelled (the server is shutting down)" : e.error}};
    return event({{"response", response}}, "response.failed");
  }
  if (e.finished) finish_reason_ = e.finish_reason;
  std::string out = take(output_stream_.feed(e.text, e.finished), true);
  if (e.finished) out += close_item();
  return out;
}

std::string ResponsesEncoder::stream_end() {
  if (failed_) return "";
  finish();
  const bool incomplete = finish_reason_ == "length";
  return event({{"response", response_object(incomplete ? "incomplete" : "completed")}},
               incomplete ? "response.incomplete" : "response.completed");
}

}  // namespace kvserve::server
