#include "server/tool_request.h"

#include <cctype>

#include "server/api_error.h"
#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxToolNameBytes = 64;
constexpr const char* kToolNamePattern = "^[a-zA-Z0-9_-]{1,64}$";

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxToolNameBytes) return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

bool is_string_value(const json* v, const char* value) {
  return v && v->is_string() && v->get_ref<const std::string&>() == value;
}

ToolDefinition parse_tool(const json& tool, const std::string& param) {
  if (!tool.is_object()) throw invalid(param, param + " must be an object {\"type\": \"function\", \"function\": {...}}");
  if (!is_string_value(field(tool, "type"), "function"))
    throw invalid(param + ".type", param + ".type must be \"function\" (the only kind of tool)");
  const json* function = field(tool, "function");
  if (!function || !function->is_object())
    throw invalid(param + ".function", param + ".function must be an object {\"name\", \"description\", \"parameters\"}");
  ToolDefinition out;
  const json* name = field(*function, "name");
  if (!name || !name->is_string() || !valid_tool_name(name->get<std::string>()))
    throw invalid(param + ".function.name", param + ".function.name must match " + kToolNamePattern);
  out.name = name->get<std::string>();
  if (const json* description = field(*function, "description")) {
    if (!description->is_string())
      throw invalid(param + ".function.description", param + ".function.description must be a string");
    out.description = description->get<std::string>();
  }
  if (const json* parameters = field(*function, "parameters")) {
    if (!parameters->is_object())
      throw invalid(param + ".function.parameters", param + ".function.parameters must be a JSON schema object");
    out.parameters = *parameters;
  }
  return out;
}

std::vector<ToolDefinition> parse_tools(const json& tools) {
  if (!tools.is_array())
    throw invalid("tools", "tools must be a list of {\"type\": \"function\", \"function\": {...}} objects");
  if (tools.size() > kMaxTools)
    throw invalid("tools", "tools may hold at most " + std::to_string(kMaxTools) + " tools, got " +
                               std::to_string(tools.size()));
  std::vector<ToolDefinition> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    ToolDefinition tool = parse_tool(tools[i], param);
    for (size_t j = 0; j < out.size(); ++j)
      if (out[j].name == tool.name)
        throw invalid(param + ".function.name", param + ".function.name \"" + tool.name +
                                                    "\" is already the name of tools[" + std::to_string(j) + "]");
    out.push_back(std::move(tool));
  }
  return out;
}

ToolChoice parse_tool_choice(const json* choice) {
  const std::string expected = "tool_choice must be \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}";
  if (!choice) return {ToolChoice::kAuto, {}};
  if (choice->is_string()) {
    const std::string& s = choice->get_ref<const std::string&>();
    if (s == "none") return {ToolChoice::kNone, {}};
    if (s == "auto") return {ToolChoice::kAuto, {}};
    if (s == "required") return {ToolChoice::kRequired, {}};
    throw invalid("tool_choice", expected + ", got \"" + s + "\"");
  }
  if (!choice->is_object()) throw invalid("tool_choice", expected);
  if (!is_string_value(field(*choice, "type"), "function"))
    throw invalid("tool_choice.type", "tool_choice.type must be \"function\"");
  const json* function = field(*choice, "function");
  const json* name = function && function->is_object() ? field(*function, "name") : nullptr;
  if (!name || !name->is_string())
    throw invalid("tool_choice.function.name", "tool_choice.function.name must be the name of one of the tools");
  return {ToolChoice::kNamed, name->get<std::string>()};
}

void reject_legacy_function_call(const json& body) {
  const json* call = field(body, "function_call");
  if (call && !is_string_value(call, "none") && !is_string_value(call, "auto"))
    throw invalid("function_call",
                  "function_call (the legacy functions API) is not supported; send tools and tool_choice instead");
}

}  // namespace

const ToolDefinition* ToolRequest::find(const std::string& name) const {
  for (const ToolDefinition& tool : tools)
    if (tool.name == name) return &tool;
  return nullptr;
}

std::optional<ToolRequest> parse_tool_request(const json& body) {
  reject_legacy_function_call(body);
  ToolRequest out;
  const json* tools = field(body, "tools");
  if (tools) out.tools = parse_tools(*tools);
  out.choice = parse_tool_choice(field(body, "tool_choice"));
  if (const json* parallel = field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean()) throw invalid("parallel_tool_calls", "parallel_tool_calls must be true or false");
    out.parallel_tool_calls = parallel->get<bool>();
  }
  // A named function is called once (vLLM's named function calling): a small
  // model forced into calls would otherwise repeat the same call until its
  // token budget ran out.
  if (out.choice.kind == ToolChoice::kNamed) out.parallel_tool_calls = false;
  if (out.tools.empty()) {
    if (out.choice.kind == ToolChoice::kRequired || out.choice.kind == ToolChoice::kNamed)
      throw invalid("tool_choice", "tool_choice asks for a tool call, but the request has no tools");
    return std::nullopt;
  }
  if (out.choice.kind == ToolChoice::kNamed && !out.find(out.choice.name))
    throw invalid("tool_choice.function.name",
                  "tool_choice names \"" + out.choice.name + "\", which is not one of the request's tools");
  out.as_given = *tools;
  return out;
}

}  // namespace kvserve::server
