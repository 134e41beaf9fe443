#include "server/response_format.h"

#include <chrono>

namespace kvserve::server {
namespace {

using json = nlohmann::json;

std::string next_response_id(Endpoint endpoint) { return unique_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"); }

json byte_values(const std::string& text) {
  json out = json::array();
  for (char c : text) out.push_back(static_cast<uint8_t>(c));
  return out;
}

// OpenAI's message.tool_calls: whole calls; streamed, the pieces as they
// come, each with its call's index (the first with id, type and name).
json tool_calls_json(const ChatDelta& delta, bool streaming) {
  json out = json::array();
  if (!streaming) {
    for (const ToolCall& call : delta.whole_calls())
      out.push_back({{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    return out;
  }
  for (const ToolCallDelta& piece : delta.calls) {
    if (piece.first)
      out.push_back({{"index", piece.index}, {"id", piece.id}, {"type", "function"},
                     {"function", {{"name", piece.name}, {"arguments", piece.arguments}}}});
    else if (!piece.arguments.empty())
      out.push_back({{"index", piece.index}, {"function", {{"arguments", piece.arguments}}}});
  }
  return out;
}

// A choice that called a tool finishes with "tool_calls" (one cut by max_tokens keeps "length").
std::string finish_reason_of(const std::string& reason, size_t calls) {
  return calls > 0 && reason == "stop" ? "tool_calls" : reason;
}

}  // namespace

ResponseFormatter::ResponseFormatter(const Tokenizer& tokenizer, const ParsedRequest& request, std::string model_id)
    : tokenizer_(tokenizer),
      endpoint_(request.endpoint),
      id_(next_response_id(request.endpoint)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      model_(std::move(model_id)),
      echo_(request.echo),
      logprobs_(request.logprobs),
      prompt_logprobs_(request.prompt_logprobs),
      n_(request.n),
      prompt_texts_(request.prompt_texts),
      started_(request.choices(), false),
      text_offsets_(request.choices(), 0),
      prompt_tokens_(request.choices(), 0),
      cached_tokens_(request.choices(), 0),
      completion_tokens_(request.choices(), 0),
      output_syntax_(chat_output_syntax(request)) {
  if (endpoint_ == Endpoint::kChat) outputs_.assign(request.choices(), ChatOutputStream(output_syntax_));
  if (output_syntax_.reasoning)
    reasoning_counters_.assign(request.choices(),
                               ReasoningTokenCounter(*output_syntax_.reasoning, output_syntax_.starts_in_reasoning));
  for (const ValidatedRequest& r : request.requests) first_prompt_tokens_.push_back(r.request().prompt.at(0));
}

json ResponseFormatter::envelope(bool streaming) const {
  const char* object = endpoint_ == Endpoint::kChat ? (streaming ? "chat.completion.chunk" : "chat.completion")
                                                    : "text_completion";
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseFormatter::usage(const std::vector<int64_t>& prompt_tokens, const std::vector<int64_t>& completion_tokens,
                              const std::vector<int64_t>& cached_tokens) const {
  int64_t prompt = 0, completion = 0, cached = 0, reasoning = 0;
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    if (i % static_cast<size_t>(n_) == 0) {  // the n choices of a prompt share it
      prompt += prompt_tokens[i];
      cached += cached_tokens[i];
    }
    completion += completion_tokens[i];
    if (!reasoning_counters_.empty()) reasoning += reasoning_counters_[i].count();
  }
  json out = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  if (output_syntax_.reasoning) out["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return out;
}

json ResponseFormatter::completion_logprobs(const std::vector<TokenLogprob>& logprobs, size_t choice) {
  json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprob& lp : logprobs) {
    const std::string piece = tokenizer_.token_bytes(lp.id);
    out["tokens"].push_back(piece);
    out["token_logprobs"].push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, value] : lp.top) top[tokenizer_.token_bytes(id)] = value;
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(text_offsets_[choice]);
    text_offsets_[choice] += piece.size();
  }
  return out;
}

json ResponseFormatter::echoed_logprobs(const std::vector<TokenLogprob>& prompt_logprobs,
                                        const std::vector<TokenLogprob>& logprobs, size_t choice) {
  const std::string first = tokenizer_.token_bytes(first_prompt_tokens_[choice / static_cast<size_t>(n_)]);
  json out = {{"tokens", {first}}, {"token_logprobs", {nullptr}}, {"top_logprobs", {nullptr}},
              {"text_offset", {text_offsets_[choice]}}};
  text_offsets_[choice] += first.size();
  const json prompt_part = completion_logprobs(prompt_logprobs, choice);  // in text order: offsets advance
  const json completion_part = completion_logprobs(logprobs, choice);
  for (const json* part : {&prompt_part, &completion_part})
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const json& v : (*part)[key]) out[key].push_back(v);
  return out;
}

json ResponseFormatter::vllm_prompt_logprobs(const std::vector<TokenLogprob>& prompt_logprobs) const {
  json out = json::array({nullptr});
  for (const TokenLogprob& lp : prompt_logprobs) {
    json position = json::object();
    for (size_t k = 0; k < lp.top.size(); ++k) {
      const auto [id, value] = lp.top[k];
      position[std::to_string(id)] = {{"logprob", value}, {"rank", k + 1}, {"decoded_token", tokenizer_.token_bytes(id)}};
    }
    position[std::to_string(lp.id)] = {{"logprob", lp.logprob}, {"rank", lp.rank},
                                       {"decoded_token", tokenizer_.token_bytes(lp.id)}};
    out.push_back(std::move(position));
  }
  return out;
}

json ResponseFormatter::chat_logprobs(const std::vector<TokenLogprob>& logprobs) const {
  json content = json::array();
  for (const TokenLogprob& lp : logprobs) {
    const std::string piece = tokenizer_.token_bytes(lp.id);
    json top = json::array();
    for (const auto& [id, value] : lp.top) {
      const std::string alt = tokenizer_.token_bytes(id);
      top.push_back({{"token", alt}, {"logprob", value}, {"bytes", byte_values(alt)}});
    }
    content.push_back({{"token", piece}, {"logprob", lp.logprob}, {"bytes", byte_values(piece)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json ResponseFormatter::logprobs_json(const std::vector<TokenLogprob>& logprobs, size_t choice) {
  if (!logprobs_) return nullptr;
  return endpoint_ == Endpoint::kChat ? chat_logprobs(logprobs) : completion_logprobs(logprobs, choice);
}

json ResponseFormatter::choice_json(size_t index, const std::vector<TokenLogprob>& logprobs,
                                    const std::vector<TokenLogprob>& prompt_logprobs) {
  const bool first = !started_[index];
  started_[index] = true;
  const bool echo_logprobs = endpoint_ == Endpoint::kCompletions && echo_ && logprobs_ && first;
  json choice = {{"index", index},
                 {"logprobs", echo_logprobs ? echoed_logprobs(prompt_logprobs, logprobs, index)
                                            : logprobs_json(logprobs, index)}};
  if (prompt_logprobs_ >= 0 && first) choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt_logprobs);
  return choice;
}

void ResponseFormatter::count_reasoning(size_t choice, const std::vector<int32_t>& tokens) {
  if (reasoning_counters_.empty()) return;
  for (int32_t id : tokens) reasoning_counters_[choice].add(tokenizer_.token_bytes(id));
}

// OpenAI's message: content null when there is no text beside tool calls (in a
// delta: when it carries calls), reasoning_content beside it for reasoning models.
json ResponseFormatter::chat_message(const ChatDelta& delta, bool first, bool streaming) const {
  json message = json::object();
  if (first || !streaming) message["role"] = "assistant";
  json calls = tool_calls_json(delta, streaming);
  const bool null_content = output_syntax_.tools && delta.content.empty() && (!streaming || !calls.empty());
  // A delta with only reasoning in it carries no content.
  const bool reasoning_only = streaming && delta.content.empty() && !delta.reasoning.empty() && calls.empty();
  if (!reasoning_only) message["content"] = null_content ? json(nullptr) : json(delta.content);
  if (output_syntax_.reasoning && (!streaming || !delta.reasoning.empty()))
    message["reasoning_content"] = delta.reasoning.empty() ? json(nullptr) : json(delta.reasoning);
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  return message;
}

json ResponseFormatter::response(const std::vector<ChoiceResult>& choices) const {
  ResponseFormatter copy = *this;  // choice_json advances per-choice state; a response is built once
  json out = envelope(false);
  out["choices"] = json::array();
  std::vector<int64_t> prompt(choices.size()), completion(choices.size()), cached(choices.size());
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& r = choices[i];
    json choice = copy.choice_json(i, r.logprobs, r.prompt_logprobs);
    std::string reason = r.finish_reason;
    if (endpoint_ == Endpoint::kChat) {
      ChatOutputStream stream(output_syntax_);
      const ChatDelta delta = stream.feed(r.text, true);
      choice["message"] = chat_message(delta, true, false);
      reason = finish_reason_of(reason, stream.calls_so_far());
      copy.count_reasoning(i, r.tokens);
    } else {
      choice["text"] = (echo_ ? prompt_texts_[i / static_cast<size_t>(n_)] : "") + r.text;
    }
    choice["finish_reason"] = reason.empty() ? json(nullptr) : json(reason);
    out["choices"].push_back(std::move(choice));
    prompt[i] = r.prompt_tokens;
    completion[i] = r.completion_tokens;
    cached[i] = r.cached_tokens;
  }
  out["usage"] = copy.usage(prompt, completion, cached);
  return out;
}

json ResponseFormatter::chunk(const ChoiceEvent& ev) {
  const GenerationEvent& e = ev.event;
  const size_t i = ev.choice;
  prompt_tokens_[i] = e.prompt_tokens;
  cached_tokens_[i] = e.cached_tokens;
  completion_tokens_[i] = e.completion_tokens;
  if (e.finished && (e.finish_reason == "error" || e.finish_reason == "cancelled")) {
    const bool cancelled = e.finish_reason == "cancelled";
    return {{"error", {{"message", cancelled ? "the request was cancelled (the server is shutting down)" : e.error},
                       {"type", "server_error"}, {"param", nullptr}, {"code", cancelled ? 503 : 500}}}};
  }
  const bool first = !started_[i];
  json choice = choice_json(i, e.logprobs, e.prompt_logprobs);
  std::string reason = e.finished ? e.finish_reason : "";
  if (endpoint_ == Endpoint::kChat) {
    ChatOutputStream& stream = outputs_[i];
    const ChatDelta delta = stream.feed(e.text, e.finished);
    count_reasoning(i, e.tokens);
    choice["delta"] = chat_message(delta, first, true);
    reason = finish_reason_of(reason, stream.calls_so_far());
  } else {
    choice["text"] = (echo_ && first ? prompt_texts_[i / static_cast<size_t>(n_)] : "") + e.text;
  }
  choice["finish_reason"] = reason.empty() ? json(nullptr) : json(reason);
  json out = envelope(true);
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json ResponseFormatter::usage_chunk() const {
  json out = envelope(true);
  out["choices"] = json::array();
  out["usage"] = usage(prompt_tokens_, completion_tokens_, cached_tokens_);
  return out;
}

}  // namespace kvserve::server
