#pragma once
// Ollama's generation requests (POST /api/chat, /api/generate) as a
// translation onto the chat and completions paths: a request becomes the
// OpenAI body it stands for (one parser, one engine path); OllamaEncoder
// (ollama_encoder.h) writes the answer in Ollama's NDJSON shapes.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_key_order.h"
#include "server/keep_alive.h"
#include "server/request_parser.h"

namespace kvserve::server {

// The body an Ollama request runs as.
struct OllamaGeneration {
  Endpoint endpoint = Endpoint::kChat;
  nlohmann::json body = nlohmann::json::object();  // in OpenAI's names; "stream" defaults to true (Ollama's default)
  KeyOrderCapture::Copies schemas_in_order;         // `format`'s schema in written order, moved to the body's path
  bool thinking_asked = false;                      // think: true or a level (the model must reason)
  // Nothing to generate (chat without messages, generate without a prompt):
  // Ollama's way to load a model, or to unload it with keep_alive 0.
  std::optional<std::string> load_reason;  // "load" or "unload"
  // How long the model stays loaded after this request (nullopt: the server's --keep-alive).
  std::optional<KeepAlive> keep_alive;
};

// Where an Ollama body may hold a schema as an object (its `format`), for
// the body's one parse (parse_request_body).
std::vector<KeyPath> ollama_schema_paths();

// /api/chat: messages (system, user, assistant with thinking and tool_calls
// whose arguments are objects, tool with tool_name), tools, format ("json" or
// a JSON schema), options (ollama_options_as_chat_fields), think (true,
// false, "low" / "medium" / "high"), stream, keep_alive. A final assistant
// message is continued (prefill). Throws ApiError 400 naming the Ollama field;
// images are refused (the served models read text only).
OllamaGeneration generation_from_ollama_chat(const nlohmann::json& body, KeyOrderCapture::Copies schemas);

// /api/generate: prompt and system as a chat turn, or with raw: true the
// prompt as is (completions); suffix as fill-in-the-middle; format, options,
// think, stream, keep_alive as for chat. template and context are refused
// (kvserve renders the model's own chat template; context is deprecated).
OllamaGeneration generation_from_ollama_generate(const nlohmann::json& body, KeyOrderCapture::Copies schemas);

// `options` as OpenAI's and vLLM's fields: temperature, top_p, top_k, min_p,
// seed, stop, num_predict (> 0: max_tokens; <= 0: no limit), repeat_penalty
// (repetition_penalty), repeat_last_n, presence_penalty, frequency_penalty.
// num_ctx, the load-time options and the samplers kvserve lacks (mirostat,
// typical_p, tfs_z, penalize_newline) are ignored, as Ollama ignores options
// it does not know. Throws ApiError 400 for a value of the wrong type.
void add_ollama_options(const nlohmann::json& options, nlohmann::json& body);

// The model a request names ("" when none); 400 when `model` is not a string.
std::string ollama_requested_model(const nlohmann::json& body);

// A chat parser's error named as the Ollama request names the field
// (max_tokens -> options.num_predict, messages -> messages, ...).
ApiError as_ollama_error(const ApiError& error);

// {"error": "..."}: Ollama's error body.
nlohmann::json ollama_error_body(const ApiError& error);

}  // namespace kvserve::server
