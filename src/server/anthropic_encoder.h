#pragma once
// The engine's events as Anthropic's Messages API writes an answer: a message
// with thinking, text and tool_use content blocks, or its SSE event sequence
// (message_start, content_block_start / delta / stop with thinking_delta,
// text_delta and input_json_delta, message_delta with stop_reason and usage,
// message_stop; an error event for a failed generation).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/response_encoder.h"

namespace kvserve::server {

class AnthropicEncoder : public ResponseEncoder {
 public:
  // One choice (Messages has no n).
  AnthropicEncoder(const ParsedRequest& request, std::string model_id);

  nlohmann::json whole(const std::vector<ChoiceResult>& choices) override;
  std::string stream_start() override;
  std::string stream_event(const ChoiceEvent& event) override;
  std::string stream_end() override;

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  std::string open_block(Block block);
  std::string close_block();
  std::string tool_use_blocks(const std::vector<ToolCallDelta>& pieces);
  std::string stop_reason(const std::string& finish_reason, const std::string& stop_sequence, bool called) const;

  ChatOutputSyntax syntax_;
  ChatOutputStream output_;
  std::string id_;
  std::string model_;
  int64_t prompt_tokens_;
  // Streaming: the block open now, the next block's index, the usage so far.
  Block open_ = Block::kNone;
  int64_t next_index_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t output_tokens_ = 0;
  std::string finish_reason_, stop_sequence_;
  bool failed_ = false;  // an error event went out: the stream ends there
};

}  // namespace kvserve::server
