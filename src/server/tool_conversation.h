#pragma once
// Tool conversations for the chat template: tool results and the assistant's
// earlier calls passed the way Hugging Face passes them, and, for templates
// that know no tools, the same conversation written out in plain messages.
#include <string>

#include <nlohmann/json.hpp>

#include "server/tool_request.h"

namespace kvserve::server {

// Adds the tool fields of request message `message` to its template message:
// role "tool" gets "tool_call_id" (and "name" when given); an assistant
// message's "tool_calls" become [{"id", "type": "function", "function":
// {"name", "arguments": <object>}}] with arguments parsed from their JSON
// string (templates write them with `| tojson`). Throws ApiError 400 naming
// the field (`param` is "messages[i]") for a tool result without string
// content or tool_call_id, or a call without a name or valid JSON arguments.
void add_tool_fields(const nlohmann::json& message, const std::string& param, nlohmann::json& template_message);

// Whether the chat template renders tools and tool calls itself.
bool template_knows_tools(const std::string& chat_template_source);

// For a template that knows no tools: the assistant's earlier calls written
// into its content in the generic JSON format, tool results named after the
// call they answer (unless named already), and, when `tools` is given,
// the tools and that format described in the system message (merged into a
// first system message, else a new one).
nlohmann::json messages_for_toolless_template(nlohmann::json messages, const ToolRequest* tools);

// Whether any message is a tool result (role "tool").
bool has_tool_results(const nlohmann::json& messages);

// Tool results as user messages "Tool result (name): ...", for templates that
// refuse the role "tool" (consecutive results share one message); takes the
// output of messages_for_toolless_template.
nlohmann::json tool_results_as_user_messages(const nlohmann::json& messages);

}  // namespace kvserve::server
