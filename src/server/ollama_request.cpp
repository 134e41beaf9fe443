#include "server/ollama_request.h"

#include <set>

#include "server/json_fields.h"
#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

const KeyPath kOllamaFormatPath = {"format"};
const KeyPath kOllamaSchemaTarget = {"json_schema"};  // llama.cpp's field: the schema itself

// Ollama's options in our names; the others are ignored (ollama_request.h says which and why).
struct OptionName {
  const char* ollama;
  const char* ours;
  enum Kind { kNumber, kInteger } kind;
};
constexpr OptionName kMappedOptions[] = {
    {"temperature", "temperature", OptionName::kNumber},
    {"top_p", "top_p", OptionName::kNumber},
    {"top_k", "top_k", OptionName::kInteger},
    {"min_p", "min_p", OptionName::kNumber},
    {"seed", "seed", OptionName::kInteger},
    {"repeat_penalty", "repetition_penalty", OptionName::kNumber},
    {"repeat_last_n", "repeat_last_n", OptionName::kInteger},
    {"presence_penalty", "presence_penalty", OptionName::kNumber},
    {"frequency_penalty", "frequency_penalty", OptionName::kNumber},
};

// Ollama's options a parser error names in our words, for as_ollama_error.
const char* ollama_option_of(const std::string& param) {
  if (param == "max_tokens") return "num_predict";
  if (param == "stop") return "stop";
  for (const OptionName& o : kMappedOptions)
    if (param == o.ours) return o.ollama;
  return nullptr;
}

std::string optional_string(const json& body, const char* key, const std::string& param) {
  const json* v = field(body, key);
  if (!v) return "";
  if (!v->is_string()) throw invalid(param, param + " must be a string");
  return v->get<std::string>();
}

// Images need a vision model; kvserve serves text-only ones.
void refuse_images(const json& obj, const std::string& param) {
  const json* images = field(obj, "images");
  if (!images || (images->is_array() && images->empty())) return;
  throw invalid(param, param + ": images are not supported (kvserve serves text-only models)");
}

// What answers a request with nothing to generate: Ollama loads the model, or unloads it with keep_alive 0.
std::string load_reason(const OllamaGeneration& out) {
  return out.keep_alive && out.keep_alive->count() == 0 ? "unload" : "load";
}

void add_format(const json& body, KeyOrderCapture::Copies schemas, OllamaGeneration& out) {
  const json* format = field(body, "format");
  if (!format || (format->is_string() && format->get_ref<const std::string&>().empty())) return;
  if (*format == "json") {
    out.body["response_format"] = {{"type", "json_object"}};
  } else if (format->is_object()) {
    out.body["json_schema"] = *format;
    if (auto it = schemas.find(kOllamaFormatPath); it != schemas.end())
      out.schemas_in_order[kOllamaSchemaTarget] = std::move(it->second);
  } else {
    throw invalid("format", "format must be \"json\" or a JSON schema object");
  }
}

// think: true / false, or a level ("low", "medium", "high") for models that take one (gpt-oss).
void add_think(const json& body, OllamaGeneration& out) {
  const json* think = field(body, "think");
  if (!think) return;
  if (think->is_boolean()) {
    out.body["chat_template_kwargs"] = {{"enable_thinking", think->get<bool>()}};
    out.thinking_asked = think->get<bool>();
    return;
  }
  static const std::set<std::string> kLevels = {"low", "medium", "high"};
  if (!think->is_string() || !kLevels.contains(think->get<std::string>()))
    throw invalid("think", "think must be true, false, \"low\", \"medium\" or \"high\"");
  out.body["chat_template_kwargs"] = {{"enable_thinking", true}};
  out.body["reasoning_effort"] = *think;
  out.thinking_asked = true;
}

// The fields chat and generate share.
void add_shared_fields(const json& body, KeyOrderCapture::Copies schemas, OllamaGeneration& out) {
  const json* stream = field(body, "stream");
  if (stream && !stream->is_boolean()) throw invalid("stream", "stream must be true or false");
  out.body["stream"] = !stream || stream->get<bool>();
  if (const json* model = field(body, "model")) out.body["model"] = *model;
  if (const json* options = field(body, "options")) add_ollama_options(*options, out.body);
  add_format(body, std::move(schemas), out);
  add_think(body, out);
  const json* logprobs = field(body, "logprobs");
  if (logprobs && *logprobs != false) throw invalid("logprobs", "logprobs are not supported by kvserve's Ollama API");
  out.keep_alive = keep_alive_field(body);
}

struct PendingCall {
  std::string id;
  std::string name;
};

// An assistant message's tool_calls in OpenAI's shape (arguments as a JSON string, an id each).
json chat_tool_calls(const json& calls, const std::string& param, std::vector<PendingCall>& pending) {
  if (!calls.is_array()) throw invalid(param, param + " must be a list");
  json out = json::array();
  pending.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = param + "[" + std::to_string(i) + "]";
    const json* function = field(calls[i], "function");
    if (!function || !function->is_object()) throw invalid(at + ".function", at + ".function must be an object");
    const std::string& name = string_field(*function, "name", at + ".function");
    const json* arguments = field(*function, "arguments");
    if (arguments && !arguments->is_object())
      throw invalid(at + ".function.arguments", at + ".function.arguments must be an object");
    const json* given_id = field(calls[i], "id");
    // Ollama's calls may have no id: the field's path pairs a tool result with its call.
    const std::string id = given_id && given_id->is_string() ? given_id->get<std::string>() : at;
    out.push_back({{"id", id}, {"type", "function"},
                   {"function", {{"name", name}, {"arguments", arguments ? arguments->dump() : "{}"}}}});
    pending.push_back({id, name});
  }
  return out;
}

// The call a tool result answers: its tool_call_id, else the first unanswered call of its tool_name, else the first.
PendingCall answered_call(const json& message, const std::string& param, std::vector<PendingCall>& pending) {
  const std::string id = optional_string(message, "tool_call_id", param + ".tool_call_id");
  const std::string name = optional_string(message, "tool_name", param + ".tool_name");
  for (auto it = pending.begin(); it != pending.end(); ++it)
    if (id.empty() ? name.empty() || it->name == name : it->id == id) {
      PendingCall call = *it;
      pending.erase(it);
      if (!name.empty()) call.name = name;
      return call;
    }
  return {id.empty() ? param : id, name};
}

json ollama_chat_message(const json& message, const std::string& param, std::vector<PendingCall>& pending) {
  if (!message.is_object()) throw invalid(param, param + " must be an object {\"role\", \"content\"}");
  const std::string& role = string_field(message, "role", param);
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool"};
  if (!kRoles.contains(role))
    throw invalid(param + ".role", param + ".role must be system, user, assistant or tool, got \"" + role + "\"");
  refuse_images(message, param + ".images");
  json out = {{"role", role}, {"content", optional_string(message, "content", param + ".content")}};
  if (role == "assistant") {
    if (const json* thinking = field(message, "thinking")) {
      if (!thinking->is_string()) throw invalid(param + ".thinking", param + ".thinking must be a string");
      out["reasoning_content"] = *thinking;
    }
    if (const json* calls = field(message, "tool_calls"); calls && !(calls->is_array() && calls->empty()))
      out["tool_calls"] = chat_tool_calls(*calls, param + ".tool_calls", pending);
  } else if (role == "tool") {
    const PendingCall call = answered_call(message, param, pending);
    out["tool_call_id"] = call.id;
    if (!call.name.empty()) out["name"] = call.name;
  }
  return out;
}

json ollama_chat_messages(const json& messages) {
  if (!messages.is_array()) throw invalid("messages", "messages must be a list");
  json out = json::array();
  std::vector<PendingCall> pending;  // the latest assistant message's calls not answered yet
  for (size_t i = 0; i < messages.size(); ++i)
    out.push_back(ollama_chat_message(messages[i], "messages[" + std::to_string(i) + "]", pending));
  return out;
}

// A final assistant message with text is a prefill: the answer continues it (Ollama's semantics).
void add_continuation(json& chat) {
  const json& messages = chat["messages"];
  const json& last = messages.back();
  if (last["role"] != "assistant" || last.contains("tool_calls") || last["content"] == "") return;
  chat["continue_final_message"] = true;
  chat["add_generation_prompt"] = false;
}

void add_tools(const json& body, json& chat) {
  const json* tools = field(body, "tools");
  if (!tools || (tools->is_array() && tools->empty())) return;
  // Ollama's tools are OpenAI's (the chat parser checks them); its type may be left out.
  json given = *tools;
  if (given.is_array())
    for (json& tool : given)
      if (tool.is_object() && !field(tool, "type")) tool["type"] = "function";
  chat["tools"] = std::move(given);
}

// Ollama's generate fields kvserve has no use for, refused rather than ignored: they would change the answer.
void refuse_generate_fields(const json& body) {
  if (!optional_string(body, "template", "template").empty())
    throw invalid("template", "template is not supported: kvserve renders the model's own chat template "
                              "(send a prompt already formatted with raw: true)");
  if (const json* context = field(body, "context"); context && !(context->is_array() && context->empty()))
    throw invalid("context", "context (deprecated in Ollama) is not supported: send the conversation to /api/chat");
  refuse_images(body, "images");
}

}  // namespace

std::vector<KeyPath> ollama_schema_paths() { return {kOllamaFormatPath}; }

void add_ollama_options(const json& options, json& body) {
  if (!options.is_object()) throw invalid("options", "options must be an object");
  for (const OptionName& o : kMappedOptions) {
    const json* v = field(options, o.ollama);
    if (!v) continue;
    const bool ok = o.kind == OptionName::kInteger ? v->is_number_integer() : v->is_number();
    if (!ok)
      throw invalid(std::string("options.") + o.ollama, std::string("options.") + o.ollama + " must be " +
                                                            (o.kind == OptionName::kInteger ? "an integer" : "a number"));
    const bool random_seed = o.ours == std::string("seed") && v->is_number_integer() && !v->is_number_unsigned() &&
                             v->get<int64_t>() < 0;  // Ollama's -1: a random seed, as without one
    if (!random_seed) body[o.ours] = *v;
  }
  if (const json* stop = field(options, "stop"))
    body["stop"] = stop->is_string() ? json::array({*stop}) : *stop;  // the chat parser checks the list
  if (const json* n = field(options, "num_predict")) {
    if (!n->is_number_integer()) throw invalid("options.num_predict", "options.num_predict must be an integer");
    if (n->is_number_unsigned() || n->get<int64_t>() > 0) body["max_tokens"] = *n;  // <= 0: no limit (-1, -2: Ollama's)
  }
  if (const json* ctx = field(options, "num_ctx"); ctx && !ctx->is_number_integer())
    throw invalid("options.num_ctx", "options.num_ctx must be an integer");
}

OllamaGeneration generation_from_ollama_chat(const json& body, KeyOrderCapture::Copies schemas) {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  OllamaGeneration out;
  add_shared_fields(body, std::move(schemas), out);
  const json* messages = field(body, "messages");
  out.body["messages"] = messages ? ollama_chat_messages(*messages) : json::array();
  if (out.body["messages"].empty()) {
    out.load_reason = load_reason(out);
    return out;
  }
  add_continuation(out.body);
  add_tools(body, out.body);
  return out;
}

OllamaGeneration generation_from_ollama_generate(const json& body, KeyOrderCapture::Copies schemas) {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  refuse_generate_fields(body);
  OllamaGeneration out;
  add_shared_fields(body, std::move(schemas), out);
  const std::string prompt = optional_string(body, "prompt", "prompt");
  const std::string suffix = optional_string(body, "suffix", "suffix");
  std::string system = optional_string(body, "system", "system");  // Ollama ignores it in raw mode
  const json* raw = field(body, "raw");
  if (raw && !raw->is_boolean()) throw invalid("raw", "raw must be true or false");
  if (prompt.empty() && suffix.empty()) {
    out.load_reason = load_reason(out);
    return out;
  }
  if (!suffix.empty() || (raw && raw->get<bool>())) {  // the prompt as is (with the suffix: fill-in-the-middle)
    out.endpoint = Endpoint::kCompletions;
    out.body["prompt"] = prompt;
    if (!suffix.empty()) out.body["suffix"] = suffix;
    return out;
  }
  json messages = json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", std::move(system)}});
  messages.push_back({{"role", "user"}, {"content", prompt}});
  out.body["messages"] = std::move(messages);
  return out;
}

std::string ollama_requested_model(const json& body) {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  return optional_string(body, "model", "model");
}

ApiError as_ollama_error(const ApiError& error) {
  const std::string& param = error.param();
  const char* option = ollama_option_of(param);
  std::string message = error.what();
  if (option && message.starts_with(param))  // "temperature must be in [0, 2]" -> "options.temperature must ..."
    message = "options." + std::string(option) + message.substr(param.size());
  else if (param == "json_schema" || param == "response_format")
    message = "format: " + message;
  return ApiError(error.status(), message, option ? "options." + std::string(option) : param, error.type());
}

json ollama_error_body(const ApiError& error) { return {{"error", error.what()}}; }

}  // namespace kvserve::server
