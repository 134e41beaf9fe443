#include "server/responses_request.h"

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

const KeyPath kChatSchemaPath = {"response_format", "json_schema", "schema"};

// A message's content: a string, or input_text / output_text parts.
std::string message_text(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw invalid(param, param + " must be a string or a list of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = param + "[" + std::to_string(i) + "]";
    const std::string type = type_of(content[i]);
    if (type != "input_text" && type != "output_text" && type != "text")
      throw invalid(at + ".type", at + ": only input_text and output_text parts are supported (not \"" + type + "\")");
    text += string_field(content[i], "text", at);
  }
  return text;
}

// The assistant message that function_call and reasoning items belong to: the
// last message when it is the assistant's (one turn), else a new one.
json& open_assistant(json& messages) {
  if (messages.empty() || messages.back()["role"] != "assistant")
    messages.push_back({{"role", "assistant"}, {"content", ""}});
  return messages.back();
}

void add_item(const json& item, const std::string& param, json& messages) {
  if (!item.is_object()) throw invalid(param, param + " must be an object");
  const std::string type = type_of(item);
  if (type.empty() || type == "message") {
    std::string role = string_field(item, "role", param);
    if (role == "developer") role = "system";
    if (role != "user" && role != "assistant" && role != "system")
      throw invalid(param + ".role", param + ".role must be user, assistant, system or developer");
    const json* content = field(item, "content");
    if (!content) throw invalid(param + ".content", param + ".content is required");
    const std::string text = message_text(*content, param + ".content");
    if (role == "assistant" && !messages.empty() && messages.back()["role"] == "assistant" &&
        messages.back()["content"] == "" && !messages.back().contains("tool_calls")) {
      messages.back()["content"] = text;  // after its reasoning item
    } else {
      messages.push_back({{"role", role}, {"content", text}});
    }
  } else if (type == "function_call") {
    json& assistant = open_assistant(messages);
    json call = {{"id", string_field(item, "call_id", param)}, {"type", "function"},
                 {"function", {{"name", string_field(item, "name", param)},
                               {"arguments", string_field(item, "arguments", param)}}}};
    if (!assistant.contains("tool_calls")) assistant["tool_calls"] = json::array();
    assistant["tool_calls"].push_back(std::move(call));
  } else if (type == "function_call_output") {
    const json* output = field(item, "output");
    if (!output) throw invalid(param + ".output", param + ".output is required");
    messages.push_back({{"role", "tool"}, {"tool_call_id", string_field(item, "call_id", param)},
                        {"content", message_text(*output, param + ".output")}});
  } else if (type == "reasoning") {
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const json* parts = field(item, key);
      if (!parts || !parts->is_array() || !text.empty()) continue;
      for (const json& part : *parts)
        if (const json* t = field(part, "text"); t && t->is_string()) text += t->get<std::string>();
    }
    open_assistant(messages)["reasoning_content"] = text;
  } else {
    throw invalid(param + ".type", param + ": input items of type \"" + type +
                                       "\" are not supported (message, function_call, function_call_output, reasoning)");
  }
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) throw invalid("tools", "tools must be a list");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!tools[i].is_object()) throw invalid(param, param + " must be an object");
    const std::string type = type_of(tools[i]);
    if (type != "function")
      throw invalid(param + ".type", param + ": only function tools are supported here, not \"" + type + "\"");
    json function = {{"name", string_field(tools[i], "name", param)}};
    for (const char* key : {"description", "parameters", "strict"})
      if (const json* v = field(tools[i], key); v && !v->is_null()) function[key] = *v;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

json chat_tool_choice(const json& choice) {
  if (choice.is_string()) return choice;  // auto, none, required: the same words
  if (!choice.is_object() || type_of(choice) != "function")
    throw invalid("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\"}");
  return {{"type", "function"}, {"function", {{"name", string_field(choice, "name", "tool_choice")}}}};
}

json chat_response_format(const json& format) {
  if (!format.is_object()) throw invalid("text.format", "text.format must be an object {\"type\": ...}");
  const std::string type = type_of(format);
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type != "json_schema") throw invalid("text.format.type", "text.format.type must be text, json_object or json_schema");
  const json* schema = field(format, "schema");
  if (!schema || !schema->is_object()) throw invalid("text.format.schema", "text.format.schema must be an object");
  json spec = {{"name", format.value("name", "response")}, {"schema", *schema}};
  if (const json* strict = field(format, "strict"); strict && !strict->is_null()) spec["strict"] = *strict;
  return {{"type", "json_schema"}, {"json_schema", std::move(spec)}};
}

}  // namespace

json responses_input_messages(const json& body) {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  const json* input = field(body, "input");
  if (!input) throw invalid("input", "input is required");
  json messages = json::array();
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) add_item((*input)[i], "input[" + std::to_string(i) + "]", messages);
  } else {
    throw invalid("input", "input must be a string or a non-empty list of items");
  }
  return messages;
}

json chat_body_from_responses(const json& body, const json& history) {
  json messages = json::array();
  if (const json* instructions = field(body, "instructions"); instructions && !instructions->is_null()) {
    if (!instructions->is_string()) throw invalid("instructions", "instructions must be a string");
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  for (const json& m : history) messages.push_back(m);
  for (json& m : responses_input_messages(body)) messages.push_back(std::move(m));
  json chat = {{"messages", std::move(messages)}};
  if (const json* max = field(body, "max_output_tokens"); max && !max->is_null()) chat["max_tokens"] = *max;
  for (const char* name : {"model", "temperature", "top_p", "stream", "parallel_tool_calls"})
    if (const json* v = field(body, name); v && !v->is_null()) chat[name] = *v;
  if (const json* tools = field(body, "tools"); tools && !tools->is_null()) chat["tools"] = chat_tools(*tools);
  if (const json* choice = field(body, "tool_choice"); choice && !choice->is_null())
    chat["tool_choice"] = chat_tool_choice(*choice);
  if (const json* text = field(body, "text"); text && !text->is_null()) {
    if (!text->is_object()) throw invalid("text", "text must be an object {\"format\": ...}");
    if (const json* format = field(*text, "format"); format && !format->is_null())
      chat["response_format"] = chat_response_format(*format);
  }
  if (const json* reasoning = field(body, "reasoning"); reasoning && !reasoning->is_null()) {
    if (!reasoning->is_object()) throw invalid("reasoning", "reasoning must be an object {\"effort\": ...}");
    if (const json* effort = field(*reasoning, "effort"); effort && !effort->is_null()) chat["reasoning_effort"] = *effort;
  }
  return chat;
}

json responses_settings(const json& body) {
  const json defaults = {{"instructions", nullptr},
                         {"tools", json::array()},
                         {"tool_choice", "auto"},
                         {"parallel_tool_calls", true},
                         {"temperature", nullptr},
                         {"top_p", nullptr},
                         {"text", {{"format", {{"type", "text"}}}}},
                         {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
                         {"max_output_tokens", nullptr},
                         {"previous_response_id", nullptr},
                         {"store", true},
                         {"metadata", json::object()},
                         {"truncation", "disabled"}};
  json out = defaults;
  for (const auto& [key, value] : defaults.items())
    if (const json* v = field(body, key.c_str()); v && !v->is_null()) out[key] = *v;
  return out;
}

ApiError as_responses_error(const ApiError& error) {
  const std::string& p = error.param();
  std::string param = p;
  if (p == "max_tokens") param = "max_output_tokens";
  else if (p.starts_with("response_format")) param = "text.format";
  else if (p.starts_with("messages")) param = "input";
  else if (p == "reasoning_effort") param = "reasoning.effort";
  else if (p.starts_with("tools[") && p.find("].function.") != std::string::npos)
    param = p.substr(0, p.find("].function.") + 1) + "." + p.substr(p.find("].function.") + 11);
  return ApiError(error.status(), error.what(), param, error.type());
}

KeyPath responses_schema_path() { return {"text", "format", "schema"}; }

KeyOrderCapture::Copies schemas_for_chat_body(KeyOrderCapture::Copies responses_copies) {
  KeyOrderCapture::Copies out;
  if (auto it = responses_copies.find(responses_schema_path()); it != responses_copies.end())
    out[kChatSchemaPath] = std::move(it->second);
  return out;
}

}  // namespace kvserve::server
