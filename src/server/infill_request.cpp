#include "server/infill_request.h"

#include "core/error.h"
#include "server/api_error.h"
#include "server/infill.h"
#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

std::string required_string(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v || !v->is_string()) throw invalid(key, std::string(key) + " is required and must be a string");
  return v->get<std::string>();
}

InfillInput infill_input(const json& body) {
  InfillInput input;
  input.prefix = required_string(body, "input_prefix");
  input.suffix = required_string(body, "input_suffix");
  if (const json* prompt = field(body, "prompt"); prompt && !prompt->is_null()) {
    if (!prompt->is_string()) throw invalid("prompt", "prompt must be a string");
    input.prompt = prompt->get<std::string>();
  }
  const json* extra = field(body, "input_extra");
  if (!extra || extra->is_null()) return input;
  if (!extra->is_array())
    throw invalid("input_extra", "input_extra must be a list of {\"filename\": string, \"text\": string}");
  for (size_t i = 0; i < extra->size(); ++i) {
    const std::string param = "input_extra[" + std::to_string(i) + "]";
    const json& chunk = (*extra)[i];
    const json* text = field(chunk, "text");
    if (!text || !text->is_string()) throw invalid(param + ".text", param + ".text must be a string");
    InfillInput::File file;
    file.text = text->get<std::string>();
    if (const json* name = field(chunk, "filename"); name && !name->is_null()) {
      if (!name->is_string()) throw invalid(param + ".filename", param + ".filename must be a string");
      file.filename = name->get<std::string>();
    }
    input.extra.push_back(std::move(file));
  }
  return input;
}

}  // namespace

json completion_body_from_infill(const json& body, const Tokenizer& tokenizer, int64_t context) {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  const InfillInput input = infill_input(body);
  int64_t n_predict = -1;
  for (const char* key : {"n_predict", "max_tokens"})
    if (const json* v = field(body, key); v && !v->is_null()) {
      if (!v->is_number_integer()) throw invalid(key, std::string(key) + " must be an integer");
      n_predict = v->get<int64_t>();
    }
  // Every input byte is at least a token's worth of work before the context check: refuse the certainly too long.
  size_t bytes = input.prefix.size() + input.suffix.size() + input.prompt.size();
  for (const InfillInput::File& file : input.extra) bytes += file.text.size() + file.filename.size();
  if (bytes > static_cast<size_t>(context) * tokenizer.max_text_bytes_per_token() * 4 + (size_t{1} << 20))
    throw invalid("input_prefix", "the input is far longer than the context of " + std::to_string(context) + " tokens");
  std::vector<int32_t> prompt;
  try {
    prompt = infill_prompt(tokenizer, input, kInfillBatch, n_predict, context);
  } catch (const Error& e) {
    throw invalid("", e.what());
  }
  json out = {{"prompt", prompt}};
  const auto room = context - static_cast<int64_t>(prompt.size());
  if (n_predict >= 0) out["max_tokens"] = n_predict;
  else if (room > 0) out["max_tokens"] = room;
  for (const char* key : {"temperature", "top_k", "top_p", "min_p", "seed", "stop", "stream", "presence_penalty",
                          "frequency_penalty", "ignore_eos"})
    if (const json* v = field(body, key); v && !v->is_null()) out[key] = *v;
  if (const json* v = field(body, "repeat_penalty"); v && !v->is_null()) out["repetition_penalty"] = *v;
  return out;
}

}  // namespace kvserve::server
