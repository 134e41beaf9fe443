#pragma once
// A chat choice's output text taken apart: the reasoning (reasoning models),
// the answer's content, and the tool calls in it. Every API shape (OpenAI
// chat, Anthropic Messages, OpenAI Responses) formats these parts; streamed
// and whole responses take them apart the same way, piece by piece.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "server/tool_request.h"

namespace kvserve::server {

// How a request's output is taken apart (from the chat template and the request).
struct ChatOutputSyntax {
  std::optional<ReasoningSyntax> reasoning;  // nullopt: the output has no reasoning part
  bool starts_in_reasoning = false;          // the prompt opened the reasoning block
  std::optional<ToolRequest> tools;          // the tools the model may call (nullopt: none)
  ToolCallFormat tool_format = ToolCallFormat::kGenericJson;
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;  // pieces of calls (tool_calls.h): whole calls are one piece each

  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  // Appends `more`; a piece that continues the last call joins its piece.
  void append(ChatDelta more);
  // The calls the pieces make up, whole (for a whole response: every piece is here).
  std::vector<ToolCall> whole_calls() const;
};

class ChatOutputStream {
 public:
  explicit ChatOutputStream(const ChatOutputSyntax& syntax);

  ChatDelta feed(std::string_view text);
  ChatDelta finish();  // the output is complete: settles what was held back
  // feed(), and finish() too when `last` (the choice's final text).
  ChatDelta feed(std::string_view text, bool last);
  size_t calls_so_far() const { return tools_ ? tools_->calls_so_far() : 0; }
  bool in_reasoning() const { return reasoning_ && reasoning_->in_reasoning(); }

 private:
  ChatDelta take_apart(ReasoningSplitter::Parts parts, bool complete);

  std::optional<ReasoningSplitter> reasoning_;
  std::optional<ToolCallStream> tools_;
};

}  // namespace kvserve::server
