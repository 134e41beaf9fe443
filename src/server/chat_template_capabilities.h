#pragma once
// What the server reads from a chat template's source, learned once when the
// server takes the template (scanning its text for markers per request was
// wasted work: the template never changes).
#include <optional>

#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "server/tool_conversation.h"
#include "tokenizer/chat_template.h"

namespace kvserve::server {

struct ChatTemplateCapabilities {
  bool knows_tools = false;  // renders `tools` and tool calls itself (template_knows_tools)
  ToolCallFormat tool_format = ToolCallFormat::kGenericJson;  // how its model writes calls (tool_call_format_for)
  std::optional<ReasoningSyntax> reasoning;  // how its model reasons, if it does (reasoning_syntax_for)

  static ChatTemplateCapabilities of(const ChatTemplate& chat_template) {
    return {template_knows_tools(chat_template.source()), tool_call_format_for(chat_template.source()),
            reasoning_syntax_for(chat_template.source())};
  }
};

}  // namespace kvserve::server
