#include "server/request_parser.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <random>
#include <set>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_input.h"
#include "server/constraint_param.h"
#include "server/infill.h"
#include "server/speculation_param.h"
#include "server/tool_conversation.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxChoices = 16;           // n, and prompts x n, per request
constexpr int64_t kMaxCompletionLogprobs = 5;  // OpenAI's limits
constexpr int64_t kMaxChatLogprobs = 20;
constexpr int64_t kCompletionsDefaultMaxTokens = 16;  // OpenAI's legacy default; chat runs to the context's end

std::string range_text(double lo, double hi) { return "[" + json(lo).dump() + ", " + json(hi).dump() + "]"; }

double number_in(const json& body, const char* name, double lo, double hi, double fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) throw invalid(name, std::string(name) + " must be a number");
  const double x = v->get<double>();
  if (x < lo || x > hi) throw invalid(name, std::string(name) + " must be in " + range_text(lo, hi) + ", got " + v->dump());
  return x;
}

// A number in (0, hi]: zero has no meaning for top_p or a multiplicative penalty.
double positive_up_to(const json& body, const char* name, double hi, double fallback) {
  const json* v = field(body, name);
  if (v && v->is_number() && (v->get<double>() <= 0 || v->get<double>() > hi))
    throw invalid(name, std::string(name) + " must be in (0, " + json(hi).dump() + "], got " + v->dump());
  return number_in(body, name, 0, hi, fallback);
}

int64_t integer_in(const json& body, const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) throw invalid(name, std::string(name) + " must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    throw invalid(name, std::string(name) + " must be at most " + std::to_string(hi) + ", got " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw invalid(name, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                            v->dump());
  return x;
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) throw invalid(name, std::string(name) + " must be true or false");
  return v->get<bool>();
}

constexpr size_t kMaxLogitBias = 1024;
constexpr size_t kMaxStopTokenIds = 64;

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}.
std::vector<std::pair<int32_t, float>> logit_bias_of(const json& body, int32_t vocab_size) {
  const json* v = field(body, "logit_bias");
  if (!v) return {};
  if (!v->is_object()) throw invalid("logit_bias", "logit_bias must be an object of token id -> bias");
  if (v->size() > kMaxLogitBias) throw invalid("logit_bias", "logit_bias may hold at most " + std::to_string(kMaxLogitBias) + " tokens");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v->items()) {
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos) id = std::stoll(key);
    if (id < 0 || id >= vocab_size)
      throw invalid("logit_bias", "logit_bias keys must be token ids in [0, " + std::to_string(vocab_size) + "), got \"" + key + "\"");
    if (!bias.is_number() || bias.get<double>() < -100 || bias.get<double>() > 100)
      throw invalid("logit_bias", "logit_bias values must be numbers in [-100, 100]");
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias.get<double>()));
  }
  return out;
}

uint64_t seed_of(const json& body) {
  const json* v = field(body, "seed");
  if (!v) return std::random_device{}();
  if (!v->is_number_integer()) throw invalid("seed", "seed must be an integer");
  return v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
}

// One stop sequence: a non-empty string (its length and the number of them
// are validate_stop_strings' to check).
std::string stop_of(const json& v) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    throw invalid("stop", "every stop sequence must be a non-empty string");
  return v.get<std::string>();
}

std::vector<std::string> stops_of(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {stop_of(*v)};
  if (!v->is_array()) throw invalid("stop", "stop must be a string or a list of strings");
  std::vector<std::string> out;
  for (const json& s : *v) out.push_back(stop_of(s));
  return out;
}

// Runs one of the engine's checks (engine/request_validation.h): its refusal
// becomes a 400 naming the field, the prompt's as the endpoint names it.
template <class Check>
void engine_check(Endpoint endpoint, Check check) {
  try {
    check();
  } catch (const RequestError& e) {
    const bool prompt = e.param() == "prompt" && endpoint == Endpoint::kChat;
    throw invalid(prompt ? "messages" : e.param(), e.what());
  }
}

// Whether obj is an object whose `key` is the string `value` (json::value()
// would throw a type error for a key of another type).
bool has_string_field(const json& obj, const char* key, const char* value) {
  if (!obj.is_object()) return false;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && it->get_ref<const std::string&>() == value;
}

void reject_unsupported(const json& body) {
  for (const char* name : {"functions", "best_of"}) {
    const json* v = field(body, name);
    if (v && !(v->is_array() && v->empty()) && !(std::string(name) == "best_of" && *v == 1))
      throw invalid(name, std::string(name) + " is not supported by this server");
  }
}

std::string message_content(const json& message, const std::string& param) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw invalid(param, param + " must be a string or a list of content parts");
  std::string text;
  for (const json& part : *it) {
    if (!has_string_field(part, "type", "text") || !part.contains("text") || !part["text"].is_string())
      throw invalid(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

// The request's tools; only chat requests may have any.
std::optional<ToolRequest> tools_for(Endpoint endpoint, const json& body) {
  std::optional<ToolRequest> tools = parse_tool_request(body);
  if (tools && endpoint != Endpoint::kChat) throw invalid("tools", "tools are only supported by /v1/chat/completions");
  return tools;
}

// A template that knows no tool results may refuse the role "tool": they
// become user messages then.
std::string apply_chat_template(const ChatTemplate& chat_template, ChatTemplateInputs& in, bool knows_tools) {
  try {
    return chat_template.apply(in);
  } catch (const Error& e) {
    if (knows_tools || !has_tool_results(in.messages)) throw invalid("messages", e.what());
  }
  in.messages = tool_results_as_user_messages(in.messages);
  try {
    return chat_template.apply(in);
  } catch (const Error& e) {
    throw invalid("messages", e.what());
  }
}

bool valid_token_id(const json& id, int32_t vocab_size) {
  if (!id.is_number_integer()) return false;
  if (id.is_number_unsigned()) return id.get<uint64_t>() < static_cast<uint64_t>(vocab_size);
  return id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab_size;
}

std::vector<int32_t> token_ids(const json& ids, int32_t vocab_size, const std::string& param) {
  std::vector<int32_t> out;
  for (const json& id : ids) {
    if (!valid_token_id(id, vocab_size))
      throw invalid(param, "token ids must be integers in [0, " + std::to_string(vocab_size) + ")");
    out.push_back(id.get<int32_t>());
  }
  return out;
}

// Throws before tokenizing a text that certainly has more than max_tokens
// tokens, so that tokenizing (~80 bytes of work memory per byte of text) never
// starts on more than max_tokens x the longest token's bytes.
void check_text_fits(const Tokenizer& tokenizer, std::string_view text, int64_t max_tokens, const std::string& param,
                     const std::string& limit) {
  const auto per_token = static_cast<int64_t>(tokenizer.max_text_bytes_per_token());
  if (static_cast<int64_t>(text.size()) > max_tokens * per_token)
    throw invalid(param, param + " has " + std::to_string(text.size()) + " bytes, more than " + limit + " can hold (" +
                             std::to_string(max_tokens) + " tokens of at most " + std::to_string(per_token) + " bytes)");
}

// The variables a chat request sets in its template: chat_template_kwargs
// (vLLM's and SGLang's field; Qwen3 reads enable_thinking) and
// reasoning_effort (gpt-oss's templates read it).
json template_variables(const json& body) {
  json out = json::object();
  if (const json* kwargs = field(body, "chat_template_kwargs"); kwargs && !kwargs->is_null()) {
    if (!kwargs->is_object())
      throw invalid("chat_template_kwargs", "chat_template_kwargs must be an object of template variables");
    out = *kwargs;
  }
  if (const json* effort = field(body, "reasoning_effort"); effort && !effort->is_null()) {
    static const std::set<std::string> kEfforts = {"none", "minimal", "low", "medium", "high"};
    if (!effort->is_string() || !kEfforts.contains(effort->get<std::string>()))
      throw invalid("reasoning_effort", "reasoning_effort must be one of none, minimal, low, medium, high");
    out["reasoning_effort"] = *effort;
  }
  return out;
}

// Whether a chat request's output is split into reasoning and content:
// llama-server's reasoning_format ("none" leaves the tags in the content).
bool reasoning_parsed(const json& body, bool template_reasons) {
  const json* format = field(body, "reasoning_format");
  if (!format || format->is_null()) return template_reasons;
  static const std::set<std::string> kFormats = {"none", "auto", "deepseek", "deepseek-legacy"};
  if (!format->is_string() || !kFormats.contains(format->get<std::string>()))
    throw invalid("reasoning_format", "reasoning_format must be one of none, auto, deepseek, deepseek-legacy");
  return template_reasons && *format != "none";
}

// The thinking budget a chat request asks for: vLLM's thinking_token_budget,
// or thinking_budget (Qwen's and FastDeploy's name); -1 asks for none.
std::optional<int64_t> reasoning_budget(const json& body) {
  std::optional<int64_t> budget;
  const char* given = nullptr;
  for (const char* name : {"thinking_token_budget", "thinking_budget"}) {
    const json* v = field(body, name);
    if (!v || v->is_null()) continue;
    if (given) throw invalid(name, std::string("give one thinking budget, not both ") + given + " and " + name);
    budget = integer_in(body, name, -1, std::numeric_limits<int32_t>::max(), -1);  // past max_tokens: no effect
    given = name;
  }
  return budget;
}

// vLLM's add_generation_prompt and continue_final_message: the final
// assistant message continued (assistant prefill) instead of a new turn.
void set_continuation(const json& body, const json& messages, RequestParser::ChatPromptOptions& options) {
  options.add_generation_prompt = boolean(body, "add_generation_prompt", true);
  options.continue_final_message = boolean(body, "continue_final_message", false);
  if (!options.continue_final_message) return;
  if (field(body, "add_generation_prompt") && options.add_generation_prompt)
    throw invalid("continue_final_message",
                  "continue_final_message continues the final message: add_generation_prompt must be false with it");
  if (!messages.is_array() || messages.empty() || !has_string_field(messages.back(), "role", "assistant"))
    throw invalid("continue_final_message", "continue_final_message needs an assistant message last");
}

// The rendered prompt up to the end of the final message's text: what
// follows it (the end of turn) is dropped, so that the model goes on writing it.
std::string cut_after_final_message(const std::string& prompt, const json& messages) {
  std::string final_text = message_content(messages.back(), "messages[" + std::to_string(messages.size() - 1) + "]");
  while (!final_text.empty() && std::isspace(static_cast<unsigned char>(final_text.back()))) final_text.pop_back();
  const size_t at = final_text.empty() ? std::string::npos : prompt.rfind(final_text);
  if (at == std::string::npos)
    throw invalid("continue_final_message",
                  "the final message's text is not in the rendered prompt (its template changes it), so it cannot be continued");
  return prompt.substr(0, at + final_text.size());
}

// How many prompts a completions request's `prompt` holds, counted before
// any of them is tokenized.
int64_t prompt_count(const json& prompt) {
  const bool token_list = prompt.is_array() && !prompt.empty() && prompt[0].is_number();
  return prompt.is_array() && !token_list ? static_cast<int64_t>(prompt.size()) : 1;
}

}  // namespace

namespace {

// Parses a request body within the limits of json_input.h; a 400 for text that is not JSON or is past one.
template <class Parse>
auto parse_body_with(Parse parse) {
  try {
    return parse();
  } catch (const JsonLimitError& e) {
    throw invalid("", std::string("the request body ") + e.what());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e400
    throw invalid("", std::string("the request body is not valid JSON: ") + e.what());
  }
}

}  // namespace

json parse_json_body(const std::string& body) {
  return parse_body_with([&] { return parse_limited_json<json>(body); });
}

RequestBody parse_request_body(const std::string& body, std::vector<KeyPath> schema_paths) {
  if (schema_paths.empty()) schema_paths = schema_object_paths();
  JsonKeepingOrder parsed = parse_body_with([&] { return parse_limited_json_keeping_order(body, schema_paths); });
  return {std::move(parsed.tree), std::move(parsed.ordered)};
}

TokenizeRequest parse_tokenize_request(const json& body) {
  if (!body.is_object() || !body.contains("content") || !body["content"].is_string())
    throw invalid("content", "content must be a string");
  TokenizeRequest out;
  out.content = body["content"].get<std::string>();
  out.add_special = boolean(body, "add_special", false);
  out.with_pieces = boolean(body, "with_pieces", false);
  return out;
}

std::vector<int32_t> parse_detokenize_request(const json& body, int32_t vocab_size, int64_t max_tokens) {
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
    throw invalid("tokens", "tokens must be a list of token ids");
  if (static_cast<int64_t>(body["tokens"].size()) > max_tokens)
    throw invalid("tokens", "tokens may hold at most " + std::to_string(max_tokens) + " ids (the context), got " +
                                std::to_string(body["tokens"].size()));
  return token_ids(body["tokens"], vocab_size, "tokens");
}

std::vector<int32_t> RequestParser::tokenize(const TokenizeRequest& request) const {
  const std::string limit = "the context of " + std::to_string(context_) + " tokens";
  check_text_fits(tokenizer_, request.content, context_, "content", limit);
  std::vector<int32_t> ids = tokenizer_.encode(request.content, request.add_special && tokenizer_.add_bos());
  if (static_cast<int64_t>(ids.size()) > context_)
    throw invalid("content", "content has " + std::to_string(ids.size()) + " tokens, more than " + limit);
  return ids;
}

std::vector<int32_t> RequestParser::vllm_tokenize(const json& body) const {
  if (const json* messages = field(body, "messages")) {
    std::optional<ToolRequest> tools = parse_tool_request(body);
    ChatPromptOptions options{tools ? &*tools : nullptr, template_variables(body)};
    set_continuation(body, *messages, options);
    return chat_prompt(*messages, nullptr, options);
  }
  const json* prompt = field(body, "prompt");
  if (!prompt || !prompt->is_string()) throw invalid("prompt", "prompt must be a string (or give messages)");
  return tokenize({prompt->get<std::string>(), boolean(body, "add_special_tokens", true), false});
}

std::vector<int32_t> RequestParser::detokenize_ids(const json& body) const {
  return parse_detokenize_request(body, tokenizer_.vocab_size(), context_);
}

std::vector<int32_t> RequestParser::checked_tokens(const json& ids, const std::string& param) const {
  return token_ids(ids, tokenizer_.vocab_size(), param);
}

RequestParser::Prompts RequestParser::completion_prompts(const json& prompt) const {
  Prompts out;
  const std::string limit = "this model's context of " + std::to_string(context_) + " tokens";
  auto add_text = [&](const std::string& text) {
    check_text_fits(tokenizer_, text, context_ - 1, "prompt", limit);
    out.tokens.push_back(tokenizer_.encode(text, tokenizer_.add_bos()));
    out.texts.push_back(text);
  };
  auto add_ids = [&](const json& ids) {
    if (static_cast<int64_t>(ids.size()) >= context_)
      throw invalid("prompt", "this model's context is " + std::to_string(context_) + " tokens, but the prompt has " +
                                  std::to_string(ids.size()) + " tokens");
    out.tokens.push_back(checked_tokens(ids, "prompt"));
    out.texts.push_back(tokenizer_.decode(out.tokens.back()));
  };
  const bool token_list = prompt.is_array() && !prompt.empty() && prompt[0].is_number();
  if (prompt.is_string()) add_text(prompt.get<std::string>());
  else if (token_list) add_ids(prompt);
  else if (prompt.is_array() && !prompt.empty())
    for (const json& p : prompt) {
      if (p.is_string()) add_text(p.get<std::string>());
      else if (p.is_array()) add_ids(p);
      else throw invalid("prompt", "prompt must be a string, a list of strings, or a list of token ids");
    }
  else throw invalid("prompt", "prompt must be a non-empty string, list of strings, or list of token ids");
  for (const auto& tokens : out.tokens)
    if (tokens.empty()) throw invalid("prompt", "the prompt is empty");
  return out;
}

// OpenAI's `suffix`: the prompt is the code before the cursor, the suffix the
// code after it, laid out for fill-in-the-middle as /infill does.
RequestParser::Prompts RequestParser::infill_prompts(const json& prompt, const json& suffix) const {
  if (!suffix.is_string()) throw invalid("suffix", "suffix must be a string");
  if (!prompt.is_string()) throw invalid("suffix", "suffix needs one prompt given as a string (the code before it)");
  const std::string limit = "this model's context of " + std::to_string(context_) + " tokens";
  check_text_fits(tokenizer_, prompt.get_ref<const std::string&>(), context_ - 1, "prompt", limit);
  check_text_fits(tokenizer_, suffix.get_ref<const std::string&>(), context_ - 1, "suffix", limit);
  InfillInput input;
  input.prefix = prompt.get<std::string>();
  input.suffix = suffix.get<std::string>();
  Prompts out;
  try {
    out.tokens.push_back(infill_prompt(tokenizer_, input, kInfillBatch, -1, context_));
  } catch (const Error& e) {
    throw invalid("suffix", e.what());
  }
  out.texts.push_back(input.prefix);
  return out;
}

std::vector<int32_t> RequestParser::chat_prompt(const json& messages, std::string* text,
                                               const ChatPromptOptions& options) const {
  if (!messages.is_array() || messages.empty()) throw invalid("messages", "messages must be a non-empty list");
  const ToolRequest* tools = options.tools;
  ChatTemplateInputs in;
  in.variables = options.variables;
  in.add_generation_prompt = options.add_generation_prompt && !options.continue_final_message;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string param = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object()) throw invalid(param, param + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) throw invalid(param + ".role", param + ".role must be a string");
    json message = {{"role", m["role"]}, {"content", message_content(m, param + ".content")}};
    // An earlier turn's reasoning: templates that know it decide whether to show it (Qwen3 keeps only the last turn's).
    if (const json* reasoning = field(m, "reasoning_content"); reasoning && !reasoning->is_null()) {
      if (!reasoning->is_string())
        throw invalid(param + ".reasoning_content", param + ".reasoning_content must be a string");
      message["reasoning_content"] = *reasoning;
    }
    add_tool_fields(m, param, message);
    in.messages.push_back(std::move(message));
  }
  set_special_tokens(in, tokenizer_);
  const ToolRequest* offered = tools && tools->calls_allowed() ? tools : nullptr;
  const bool knows_tools = template_capabilities_.knows_tools;
  if (knows_tools && offered) in.tools = offered->as_given;
  if (!knows_tools) in.messages = messages_for_toolless_template(std::move(in.messages), offered);
  std::string prompt = apply_chat_template(chat_template_, in, knows_tools);
  if (options.continue_final_message) prompt = cut_after_final_message(prompt, messages);
  check_text_fits(tokenizer_, prompt, context_ - 1, "messages",
                  "this model's context of " + std::to_string(context_) + " tokens");
  if (text) *text = prompt;
  return encode_rendered_prompt(tokenizer_, in, prompt);
}

GenerationRequest RequestParser::shared_settings(Endpoint endpoint, const json& body, ParsedRequest& out) const {
  GenerationRequest r;
  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(number_in(body, "temperature", 0, 2, s.temperature));
  s.top_p = static_cast<float>(positive_up_to(body, "top_p", 1, s.top_p));
  s.top_k = static_cast<int32_t>(integer_in(body, "top_k", -1, tokenizer_.vocab_size(), s.top_k));
  s.min_p = static_cast<float>(number_in(body, "min_p", 0, 1, s.min_p));
  s.presence_penalty = static_cast<float>(number_in(body, "presence_penalty", -2, 2, 0));
  s.frequency_penalty = static_cast<float>(number_in(body, "frequency_penalty", -2, 2, 0));
  s.repetition_penalty = static_cast<float>(positive_up_to(body, "repetition_penalty", 10, 1));
  // llama.cpp's and Ollama's window of the penalties (-1: the whole history, 0: none).
  s.repeat_last_n = static_cast<int32_t>(integer_in(body, "repeat_last_n", -1, std::numeric_limits<int32_t>::max(),
                                                    s.repeat_last_n));
  s.seed = seed_of(body);
  r.stop = stops_of(body);
  engine_check(endpoint, [&] { validate_stop_strings(r.stop); });  // before the request is copied per prompt
  r.ignore_eos = boolean(body, "ignore_eos", false);
  r.logit_bias = logit_bias_of(body, tokenizer_.vocab_size());
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array() || ids->size() > kMaxStopTokenIds)
      throw invalid("stop_token_ids", "stop_token_ids must be a list of at most " + std::to_string(kMaxStopTokenIds) + " token ids");
    r.stop_token_ids = checked_tokens(*ids, "stop_token_ids");
  }
  // Bounded by max_tokens once that is known (fit_to_context): a too-long request is a max_tokens error.
  r.min_tokens = integer_in(body, "min_tokens", 0, std::numeric_limits<int32_t>::max(), 0);
  // A seeded sampled request expects the same text from the same seed, and auto's drafting follows measured
  // step times, so its random draws would differ from run to run: the server's default auto does not apply to
  // it (a request that names "speculative" itself still gets what it asks for).
  SpeculationSettings default_speculation = speculation_;
  if (default_speculation.mode == SpeculativeMode::kAuto && field(body, "seed") != nullptr && s.temperature > 0)
    default_speculation.mode = SpeculativeMode::kNone;
  r.speculation = parse_speculation(body, default_speculation, has_draft_model_);
  out.n = integer_in(body, "n", 1, kMaxChoices, 1);
  out.stream = boolean(body, "stream", false);
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) throw invalid("stream_options", "stream_options must be an object");
    out.include_usage = boolean(*options, "include_usage", false);
  }
  if (endpoint == Endpoint::kChat) {
    out.logprobs = boolean(body, "logprobs", false);
    r.top_logprobs = static_cast<int32_t>(integer_in(body, "top_logprobs", 0, kMaxChatLogprobs, 0));
    if (field(body, "top_logprobs") && !out.logprobs) throw invalid("top_logprobs", "top_logprobs needs logprobs: true");
    if (!out.logprobs) r.top_logprobs = -1;
  } else {
    r.top_logprobs = static_cast<int32_t>(integer_in(body, "logprobs", 0, kMaxCompletionLogprobs, -1));
    out.logprobs = r.top_logprobs >= 0;
    out.echo = boolean(body, "echo", false);
    if (out.echo && out.logprobs) r.prompt_logprobs = r.top_logprobs;  // the echoed prompt's tokens come with theirs
  }
  // vLLM's prompt_logprobs: each prompt token's logprob and rank, with this many most likely alternatives.
  if (field(body, "prompt_logprobs") && !field(body, "prompt_logprobs")->is_null()) {
    out.prompt_logprobs = static_cast<int32_t>(integer_in(body, "prompt_logprobs", 0, kMaxPromptLogprobs, 0));
    r.prompt_logprobs = std::max(r.prompt_logprobs, out.prompt_logprobs);
  }
  if (const json* model = field(body, "model"); model && !model->is_string())
    throw invalid("model", "model must be a string");
  return r;
}

void RequestParser::fit_to_context(const std::vector<int32_t>& prompt, const json& body, Endpoint endpoint,
                                   MaxTokens policy, GenerationRequest& r) const {
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  const char* prompt_param = endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt_tokens >= context_)
    throw invalid(prompt_param, "this model's context is " + std::to_string(context_) + " tokens, but the prompt has " +
                                    std::to_string(prompt_tokens) + " tokens");
  const int64_t room = context_ - prompt_tokens;
  const char* name = field(body, "max_completion_tokens") && !field(body, "max_tokens") ? "max_completion_tokens" : "max_tokens";
  if (policy == MaxTokens::kAtMost) {
    r.max_tokens = std::min(room, integer_in(body, name, 0, std::numeric_limits<int64_t>::max(), room));
    return;
  }
  const int64_t fallback = endpoint == Endpoint::kChat ? room : std::min(room, kCompletionsDefaultMaxTokens);
  r.max_tokens = integer_in(body, name, 0, context_, fallback);
  if (r.max_tokens > room)
    throw invalid(name, "this model's context is " + std::to_string(context_) + " tokens; the prompt has " +
                            std::to_string(prompt_tokens) + " and " + name + " asks for " + std::to_string(r.max_tokens));
}

// The engine's own checks, with its limits (a prompt shorter than context_ may
// still not fit its KV pool): a request that passed here is never refused by
// Engine::submit, and each refusal names its field.
ValidatedRequest RequestParser::validate_for_engine(GenerationRequest r, Endpoint endpoint) const {
  std::optional<ValidatedRequest> validated;
  engine_check(endpoint, [&] { validated.emplace(std::move(r), engine_limits_); });
  return std::move(*validated);
}

ParsedRequest RequestParser::parse(Endpoint endpoint, const json& body, MaxTokens max_tokens) const {
  if (!body.is_object()) throw invalid("", "the request body must be a JSON object");
  reject_unsupported(body);
  std::optional<ToolRequest> tools = tools_for(endpoint, body);  // tools (helper)
  ParsedRequest out;
  out.endpoint = endpoint;
  const GenerationRequest shared = shared_settings(endpoint, body, out);
  Prompts prompts;
  if (endpoint == Endpoint::kChat) {
    const json* messages = field(body, "messages");
    if (!messages) throw invalid("messages", "messages is required");
    std::string text;
    ChatPromptOptions options{tools ? &*tools : nullptr, template_variables(body)};
    set_continuation(body, *messages, options);
    prompts.tokens.push_back(chat_prompt(*messages, &text, options));
    if (template_capabilities_.reasoning) {
      out.template_reasons = true;
      out.reasoning_open = prompt_opens_reasoning(text, *template_capabilities_.reasoning);
      out.reasoning_budget = reasoning_budget(body);
    }
    if (reasoning_parsed(body, template_capabilities_.reasoning.has_value())) out.reasoning = template_capabilities_.reasoning;
    prompts.texts.push_back(std::move(text));
  } else {
    const json* prompt = field(body, "prompt");
    if (!prompt) throw invalid("prompt", "prompt is required");
    // Before tokenizing any: a list of 16 MiB of prompts is refused at once.
    if (prompt_count(*prompt) * out.n > kMaxChoices)
      throw invalid("n", "prompts x n may be at most " + std::to_string(kMaxChoices) + ", got " +
                             std::to_string(prompt_count(*prompt)) + " x " + std::to_string(out.n));
    const json* suffix = field(body, "suffix");
    if (suffix && !suffix->is_null() && !(suffix->is_string() && suffix->get_ref<const std::string&>().empty())) {
      prompts = infill_prompts(*prompt, *suffix);
    } else {
      prompts = completion_prompts(*prompt);
    }
  }
  for (auto& tokens : prompts.tokens) {
    GenerationRequest r = shared;
    fit_to_context(tokens, body, endpoint, max_tokens, r);
    if (r.min_tokens > r.max_tokens)
      throw invalid("min_tokens", "min_tokens (" + std::to_string(r.min_tokens) + ") is more than max_tokens (" +
                                      std::to_string(r.max_tokens) + ")");
    r.prompt = std::move(tokens);
    r.n = static_cast<int32_t>(out.n);  // prefilled once, forked n ways; sequence j samples with seed + j
    out.requests.push_back(validate_for_engine(std::move(r), endpoint));
  }
  out.prompt_texts = std::move(prompts.texts);
  out.constraint = parse_constraint(body);
  out.tool_format = template_capabilities_.tool_format;
  out.tools = std::move(tools);
  return out;
}

}  // namespace kvserve::server
