#pragma once
// The engine's events as OpenAI's Responses API writes an answer: a response
// object whose output holds reasoning, message (output_text) and
// function_call items, or its typed SSE events (response.created,
// response.in_progress, response.output_item.added / done,
// response.content_part.added / done, response.output_text.delta / done,
// response.reasoning_text.delta / done, response.function_call_arguments.delta
// / done, response.completed or response.incomplete; response.failed for a
// failed generation), each with its sequence_number.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/reasoning.h"
#include "server/response_encoder.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::server {

class ResponsesEncoder : public ResponseEncoder {
 public:
  // Called once with the finished response and the answer as a chat message
  // (content, reasoning_content, tool_calls): what the store keeps.
  using Finished = std::function<void(const nlohmann::json& response, const nlohmann::json& answer)>;

  // settings: the request's fields a response echoes (responses_settings()).
  ResponsesEncoder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string model_id,
                   nlohmann::json settings, Finished on_finished);

  const std::string& id() const { return id_; }
  nlohmann::json whole(const std::vector<ChoiceResult>& choices) override;
  std::string stream_start() override;
  std::string stream_event(const ChoiceEvent& event) override;
  std::string stream_end() override;

 private:
  enum class Item { kNone, kReasoning, kMessage };
  nlohmann::json response_object(const std::string& status) const;
  std::string event(nlohmann::json data, const std::string& type);
  std::string open_item(Item kind);
  std::string close_item();
  std::string function_calls(const std::vector<ToolCallDelta>& pieces, bool streaming);
  std::string take(const ChatDelta& delta, bool streaming);
  void count(const std::vector<int32_t>& tokens);
  void finish();

  const Tokenizer& tokenizer_;
  ChatOutputSyntax syntax_;
  ChatOutputStream output_stream_;
  std::optional<ReasoningTokenCounter> reasoning_tokens_;
  std::string id_;
  int64_t created_;
  std::string model_;
  nlohmann::json settings_;
  Finished on_finished_;
  // The answer so far: finished output items, the one open now, the same as a chat message.
  nlohmann::json output_ = nlohmann::json::array();
  Item open_ = Item::kNone;
  std::string open_id_, open_text_;
  ToolCall open_call_;  // the function call streaming now (its arguments so far)
  nlohmann::json answer_ = {{"role", "assistant"}, {"content", ""}};
  int64_t sequence_ = 0;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, output_tokens_ = 0;
  std::string finish_reason_;
  bool failed_ = false;
};

}  // namespace kvserve::server
