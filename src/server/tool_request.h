#pragma once
// The tool-calling fields of a chat request (OpenAI's `tools`, `tool_choice`,
// `parallel_tool_calls`), checked and turned into a ToolRequest.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvserve::server {

// At most this many tools per request (OpenAI's limit).
inline constexpr size_t kMaxTools = 128;

struct ToolDefinition {
  std::string name;
  std::string description;
  nlohmann::json parameters;  // a JSON schema object; null when the tool has none
};

struct ToolChoice {
  enum Kind { kNone, kAuto, kRequired, kNamed } kind = kAuto;
  std::string name;  // kNamed: the tool that must be called
};

struct ToolRequest {
  std::vector<ToolDefinition> tools;
  ToolChoice choice;
  bool parallel_tool_calls = true;
  // The `tools` list as the client sent it: the chat template's `tools`
  // variable (Hugging Face passes it unchanged).
  nlohmann::json as_given = nlohmann::json::array();

  const ToolDefinition* find(const std::string& name) const;
  // Whether the model may call tools at all (tool_choice is not "none").
  bool calls_allowed() const { return choice.kind != ToolChoice::kNone; }
};

// The request's tools, or nullopt when it has none (`tools` absent, null or
// empty). Throws ApiError 400 naming the field at fault, e.g.
// "tools[2].function.name must match ^[a-zA-Z0-9_-]{1,64}$". The legacy
// `function_call` is refused unless it is "none" or "auto" (`functions` is
// refused with the other unsupported fields).
std::optional<ToolRequest> parse_tool_request(const nlohmann::json& body);

}  // namespace kvserve::server
