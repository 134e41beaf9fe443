#include "server/anthropic_messages.h"

#include "server/json_fields.h"
#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

// A string, or a list of text blocks (system prompts, tool results).
std::string text_of(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw invalid(param, param + " must be a string or a list of text blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string block = param + "[" + std::to_string(i) + "]";
    if (type_of(content[i]) != "text")
      throw invalid(block, block + ": only text blocks are supported here (images and documents are not)");
    text += string_field(content[i], "text", block);
  }
  return text;
}

// One Messages message as chat messages: a user turn's tool results come first, as tool messages.
void add_message(const json& message, const std::string& param, json& out) {
  if (!message.is_object()) throw invalid(param, param + " must be an object {\"role\", \"content\"}");
  const std::string& role = string_field(message, "role", param);
  if (role != "user" && role != "assistant")
    throw invalid(param + ".role", param + ".role must be \"user\" or \"assistant\" (system goes in `system`)");
  const json* content = field(message, "content");
  if (!content) throw invalid(param + ".content", param + ".content is required");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array()) throw invalid(param + ".content", param + ".content must be a string or a list of blocks");
  std::string text, reasoning;
  json calls = json::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const json& block = (*content)[i];
    const std::string at = param + ".content[" + std::to_string(i) + "]";
    const std::string type = type_of(block);
    if (type == "text") {
      text += string_field(block, "text", at);
    } else if (type == "tool_use" && role == "assistant") {
      const json* input = field(block, "input");
      if (!input || !input->is_object()) throw invalid(at + ".input", at + ".input must be an object");
      calls.push_back({{"id", string_field(block, "id", at)}, {"type", "function"},
                       {"function", {{"name", string_field(block, "name", at)}, {"arguments", input->dump()}}}});
    } else if (type == "tool_result" && role == "user") {
      const json* result = field(block, "content");
      std::string result_text = result && !result->is_null() ? text_of(*result, at + ".content") : "";
      if (const json* is_error = field(block, "is_error"); is_error && *is_error == true)
        result_text = "Error: " + result_text;
      out.push_back({{"role", "tool"}, {"tool_call_id", string_field(block, "tool_use_id", at)},
                     {"content", result_text}});
    } else if (type == "thinking" && role == "assistant") {
      reasoning += string_field(block, "thinking", at);
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Encrypted by Anthropic's servers: nothing a local model can read.
    } else {
      throw invalid(at + ".type", at + ": a " + role + " message cannot hold a block of type \"" + type +
                                      "\" here (text, tool_use, tool_result, thinking are supported)");
    }
  }
  if (role == "user" && text.empty() && !out.empty() && out.back()["role"] == "tool") return;
  json chat = {{"role", role}, {"content", text}};
  if (!calls.empty()) chat["tool_calls"] = std::move(calls);
  if (!reasoning.empty()) chat["reasoning_content"] = std::move(reasoning);
  out.push_back(std::move(chat));
}

bool chat_messages_end_with_assistant(const json& messages) {
  return !messages.empty() && messages.back()["role"] == "assistant" && !messages.back().contains("tool_calls");
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) throw invalid("tools", "tools must be a list");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    const json& tool = tools[i];
    if (!tool.is_object()) throw invalid(param, param + " must be an object {\"name\", \"input_schema\"}");
    const std::string type = type_of(tool);
    if (!type.empty() && type != "custom")
      throw invalid(param + ".type", param + ": Anthropic's server tools (\"" + type + "\") are not available here");
    const json* schema = field(tool, "input_schema");
    if (!schema || !schema->is_object()) throw invalid(param + ".input_schema", param + ".input_schema must be an object");
    json function = {{"name", string_field(tool, "name", param)}, {"parameters", *schema}};
    if (const json* description = field(tool, "description")) function["description"] = *description;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

void add_tool_choice(const json& choice, json& chat) {
  if (!choice.is_object()) throw invalid("tool_choice", "tool_choice must be an object {\"type\": ...}");
  const std::string type = type_of(choice);
  if (type == "auto") chat["tool_choice"] = "auto";
  else if (type == "any") chat["tool_choice"] = "required";
  else if (type == "none") chat["tool_choice"] = "none";
  else if (type == "tool")
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_field(choice, "name", "tool_choice")}}}};
  else throw invalid("tool_choice.type", "tool_choice.type must be auto, any, tool or none");
  if (const json* one = field(choice, "disable_parallel_tool_use"); one && one->is_boolean())
    chat["parallel_tool_calls"] = !one->get<bool>();
}

void add_thinking(const json& thinking, json& chat) {
  if (!thinking.is_object()) throw invalid("thinking", "thinking must be an object {\"type\": \"enabled\" | \"disabled\"}");
  const std::string type = type_of(thinking);
  if (type != "enabled" && type != "disabled")
    throw invalid("thinking.type", "thinking.type must be \"enabled\" or \"disabled\"");
  const json* budget = field(thinking, "budget_tokens");
  if (budget && !budget->is_null() && !(budget->is_number_integer() && budget->get<int64_t>() >= 0))
    throw invalid("thinking.budget_tokens", "thinking.budget_tokens must be a non-negative integer");
  chat["chat_template_kwargs"] = {{"enable_thinking", type == "enabled"}};
  if (type == "enabled" && budget && !budget->is_null()) chat["thinking_token_budget"] = *budget;
}

}  // namespace

json chat_body_from_messages(const json& body, bool counting) {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  json chat = json::object();
  json messages = json::array();
  if (const json* system = field(body, "system"); system && !system->is_null())
    messages.push_back({{"role", "system"}, {"content", text_of(*system, "system")}});
  const json* given = field(body, "messages");
  if (!given || !given->is_array() || given->empty()) throw invalid("messages", "messages must be a non-empty list");
  for (size_t i = 0; i < given->size(); ++i) add_message((*given)[i], "messages[" + std::to_string(i) + "]", messages);
  // A final assistant message is a prefill: the answer continues it (Anthropic's semantics).
  if (chat_messages_end_with_assistant(messages)) {
    chat["continue_final_message"] = true;
    chat["add_generation_prompt"] = false;
  }
  chat["messages"] = std::move(messages);
  const json* max_tokens = field(body, "max_tokens");
  if (!max_tokens && !counting) throw invalid("max_tokens", "max_tokens is required");
  if (max_tokens) {
    if (!max_tokens->is_number_integer() || max_tokens->get<int64_t>() < 1)
      throw invalid("max_tokens", "max_tokens must be an integer of at least 1");
    chat["max_tokens"] = *max_tokens;
  }
  if (const json* stops = field(body, "stop_sequences"); stops && !stops->is_null()) {
    if (!stops->is_array()) throw invalid("stop_sequences", "stop_sequences must be a list of strings");
    chat["stop"] = *stops;
  }
  for (const char* name : {"model", "temperature", "top_p", "top_k", "stream"})
    if (const json* v = field(body, name)) chat[name] = *v;
  if (const json* tools = field(body, "tools"); tools && !tools->is_null()) chat["tools"] = chat_tools(*tools);
  if (const json* choice = field(body, "tool_choice"); choice && !choice->is_null()) add_tool_choice(*choice, chat);
  if (const json* thinking = field(body, "thinking"); thinking && !thinking->is_null()) add_thinking(*thinking, chat);
  return chat;
}

ApiError as_messages_error(const ApiError& error) {
  std::string param = error.param();
  if (param == "stop") param = "stop_sequences";
  else if (param.starts_with("tools[") && param.ends_with("].function.parameters"))
    param = param.substr(0, param.size() - std::string(".function.parameters").size()) + ".input_schema";
  else if (param.starts_with("messages[")) param = "messages";  // chat indices differ from the request's
  return ApiError(error.status(), error.what(), param, error.type());
}

json messages_error_body(const ApiError& error) {
  std::string type;
  switch (error.status()) {
    case 400: case 411: case 431: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: case 529: type = "overloaded_error"; break;
    default: type = error.status() < 500 ? "invalid_request_error" : "api_error"; break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", error.what()}}}};
}

}  // namespace kvserve::server
