#include "server/tool_conversation.h"

#include <map>

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/tool_calls.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

bool is_role(const json& message, const char* role) {
  const json* r = field(message, "role");
  return r && r->is_string() && r->get_ref<const std::string&>() == role;
}

// One entry of an assistant message's tool_calls, as the template sees it.
json template_tool_call(const json& call, const std::string& param) {
  if (!call.is_object()) throw invalid(param, param + " must be an object {\"id\", \"type\": \"function\", \"function\"}");
  const json* type = field(call, "type");
  if (type && *type != "function") throw invalid(param + ".type", param + ".type must be \"function\"");
  const json* function = field(call, "function");
  if (!function || !function->is_object())
    throw invalid(param + ".function", param + ".function must be an object {\"name\", \"arguments\"}");
  const json* name = field(*function, "name");
  if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
    throw invalid(param + ".function.name", param + ".function.name must be a non-empty string");
  const json* arguments = field(*function, "arguments");
  const std::string arguments_param = param + ".function.arguments";
  if (!arguments || !arguments->is_string())
    throw invalid(arguments_param, arguments_param + " must be a string holding the arguments as JSON");
  std::optional<json> parsed = parse_bounded_json<json>(arguments->get<std::string>());
  if (!parsed)
    throw invalid(arguments_param, arguments_param + " is not valid JSON (or nests deeper than " +
                                       std::to_string(kMaxJsonDepth) + " levels)");
  json out = {{"type", "function"}, {"function", {{"name", *name}, {"arguments", std::move(*parsed)}}}};
  if (const json* id = field(call, "id")) {
    if (!id->is_string()) throw invalid(param + ".id", param + ".id must be a string");
    out["id"] = *id;
  }
  return out;
}

void add_tool_result_fields(const json& message, const std::string& param, json& out) {
  const json* content = field(message, "content");
  if (!content || (!content->is_string() && !content->is_array()))
    throw invalid(param + ".content", param + ".content must be a string (the tool's result)");
  const json* id = field(message, "tool_call_id");
  if (!id || !id->is_string())
    throw invalid(param + ".tool_call_id", param + ".tool_call_id must be a string (the id of the call it answers)");
  out["tool_call_id"] = *id;
  if (const json* name = field(message, "name"); name && name->is_string()) out["name"] = *name;
}

// The request's tools and how to call them, for a model whose template does not show it any.
std::string tools_system_text(const ToolRequest& tools) {
  std::string text = "You can call these functions (tools), given as JSON schemas:\n";
  for (const json& tool : tools.as_given) text += tool.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  text += "\nTo call a function, answer with only a JSON object of this form: "
          "{\"name\": <function name>, \"arguments\": <its arguments as a JSON object>}";
  if (tools.parallel_tool_calls) text += "\nTo call several functions, write one such object per line.";
  switch (tools.choice.kind) {
    case ToolChoice::kRequired: text += "\nYou must call a function."; break;
    case ToolChoice::kNamed: text += "\nYou must call the function " + tools.choice.name + "."; break;
    default: text += "\nIf no function is needed, answer in plain text."; break;
  }
  return text;
}

// An assistant message's calls as the text the model would have written in the generic format.
std::string calls_as_text(const json& calls) {
  std::string text;
  for (const json& call : calls) {
    const json& function = call["function"];
    text += (text.empty() ? "" : "\n") +
            tool_call_text(function["name"].get<std::string>(),
                           function["arguments"].dump(-1, ' ', false, json::error_handler_t::replace),
                           ToolCallFormat::kGenericJson);
  }
  return text;
}

}  // namespace

void add_tool_fields(const json& message, const std::string& param, json& template_message) {
  if (is_role(message, "tool")) add_tool_result_fields(message, param, template_message);
  if (!is_role(message, "assistant")) return;
  const json* calls = field(message, "tool_calls");
  if (!calls) return;
  if (!calls->is_array()) throw invalid(param + ".tool_calls", param + ".tool_calls must be a list");
  if (calls->empty()) return;
  json out = json::array();
  for (size_t i = 0; i < calls->size(); ++i)
    out.push_back(template_tool_call((*calls)[i], param + ".tool_calls[" + std::to_string(i) + "]"));
  template_message["tool_calls"] = std::move(out);
}

bool template_knows_tools(const std::string& source) {
  return source.find("tools") != std::string::npos || source.find("tool_calls") != std::string::npos;
}

json messages_for_toolless_template(json messages, const ToolRequest* tools) {
  std::map<std::string, std::string> call_names;  // tool_call id -> function name
  for (json& m : messages) {
    if (is_role(m, "tool") && !m.contains("name")) {  // which tool answered, for results written as text
      if (auto it = call_names.find(m.value("tool_call_id", "")); it != call_names.end()) m["name"] = it->second;
    }
    if (!m.contains("tool_calls")) continue;
    for (const json& call : m["tool_calls"])
      if (call.contains("id")) call_names[call["id"].get<std::string>()] = call["function"]["name"].get<std::string>();
    std::string content = m.value("content", "");
    m["content"] = content + (content.empty() ? "" : "\n") + calls_as_text(m["tool_calls"]);
    m.erase("tool_calls");
  }
  if (!tools) return messages;
  const std::string text = tools_system_text(*tools);
  if (!messages.empty() && is_role(messages[0], "system")) {
    const std::string content = messages[0].value("content", "");
    messages[0]["content"] = content + (content.empty() ? "" : "\n\n") + text;
  } else {
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", text}});
  }
  return messages;
}

bool has_tool_results(const json& messages) {
  for (const json& m : messages)
    if (is_role(m, "tool")) return true;
  return false;
}

json tool_results_as_user_messages(const json& messages) {
  json out = json::array();
  bool after_result = false;
  for (const json& m : messages) {
    if (!is_role(m, "tool")) {
      out.push_back(m);
      after_result = false;
      continue;
    }
    const std::string name = m.value("name", "");
    const std::string line = "Tool result" + (name.empty() ? "" : " (" + name + ")") + ": " + m.value("content", "");
    if (after_result) out.back()["content"] = out.back()["content"].get<std::string>() + "\n\n" + line;
    else out.push_back({{"role", "user"}, {"content", line}});
    after_result = true;
  }
  return out;
}

}  // namespace kvserve::server
