#pragma once
// OpenAI response shapes: whole responses (non-streaming), per-event chunks
// (streaming), logprobs and usage, for both the completions and the chat
// endpoints.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/generation_job.h"
#include "server/request_parser.h"
#include "server/response_encoder.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::server {

class ResponseFormatter {
 public:
  ResponseFormatter(const Tokenizer& tokenizer, const ParsedRequest& request, std::string model_id);

  // The non-streaming response body.
  nlohmann::json response(const std::vector<ChoiceResult>& choices) const;
  // The streaming chunk for one engine event (an {"error": ...} object for a
  // choice that failed or was cancelled).
  nlohmann::json chunk(const ChoiceEvent& event);
  // The last chunk when stream_options.include_usage is set: no choices, only usage.
  nlohmann::json usage_chunk() const;

 private:
  nlohmann::json envelope(bool streaming) const;
  // A choice's index and logprobs; what it says and why it finished are the caller's.
  nlohmann::json choice_json(size_t index, const std::vector<TokenLogprob>& logprobs,
                             const std::vector<TokenLogprob>& prompt_logprobs);
  // The chat message (or streamed delta) of a choice's taken-apart output;
  // first_call: the index of its first call in the choice.
  nlohmann::json chat_message(const ChatDelta& delta, bool first, bool streaming) const;
  // A choice's reasoning tokens so far, its `tokens` counted in.
  void count_reasoning(size_t choice, const std::vector<int32_t>& tokens);
  nlohmann::json logprobs_json(const std::vector<TokenLogprob>& logprobs, size_t choice);
  nlohmann::json completion_logprobs(const std::vector<TokenLogprob>& logprobs, size_t choice);
  // echo with logprobs: the prompt's tokens first (the first with null logprobs), then the completion's.
  nlohmann::json echoed_logprobs(const std::vector<TokenLogprob>& prompt_logprobs,
                                 const std::vector<TokenLogprob>& logprobs, size_t choice);
  // vLLM's prompt_logprobs: [null, {"id": {"logprob", "rank", "decoded_token"}}, ...] over the prompt.
  nlohmann::json vllm_prompt_logprobs(const std::vector<TokenLogprob>& prompt_logprobs) const;
  nlohmann::json chat_logprobs(const std::vector<TokenLogprob>& logprobs) const;
  // usage, with prompt_tokens_details.cached_tokens (the prefix cache's hits).
  // With completion_tokens_details.reasoning_tokens when the output may reason.
  nlohmann::json usage(const std::vector<int64_t>& prompt_tokens, const std::vector<int64_t>& completion_tokens,
                       const std::vector<int64_t>& cached_tokens) const;

  const Tokenizer& tokenizer_;
  Endpoint endpoint_;
  std::string id_;
  int64_t created_;
  std::string model_;
  bool echo_;
  bool logprobs_;
  int32_t prompt_logprobs_;               // vLLM's field: -1 when not asked
  std::vector<int32_t> first_prompt_tokens_;  // per prompt: its first token (no logprob of its own)
  int64_t n_;
  std::vector<std::string> prompt_texts_;
  std::vector<bool> started_;            // per choice: its first chunk has gone out
  std::vector<size_t> text_offsets_;     // per choice: bytes of text so far (completions logprobs)
  std::vector<int64_t> prompt_tokens_;   // per choice, from its final event
  std::vector<int64_t> cached_tokens_;   // per choice: prompt tokens found in the prefix cache
  std::vector<int64_t> completion_tokens_;
  std::vector<ReasoningTokenCounter> reasoning_counters_;  // per choice, for a reasoning output
  // Chat: how the output is taken apart (reasoning, content, tool calls), and per choice its stream.
  ChatOutputSyntax output_syntax_;
  std::vector<ChatOutputStream> outputs_;
};

// The OpenAI shapes as a ResponseEncoder: SSE chunks as `data:` lines, the
// usage chunk when stream_options.include_usage asks for it, `data: [DONE]` last.
class OpenAiEncoder : public ResponseEncoder {
 public:
  OpenAiEncoder(ResponseFormatter formatter, bool include_usage)
      : formatter_(std::move(formatter)), include_usage_(include_usage) {}
  nlohmann::json whole(const std::vector<ChoiceResult>& choices) override { return formatter_.response(choices); }
  std::string stream_event(const ChoiceEvent& event) override { return sse_event(formatter_.chunk(event)); }
  std::string stream_end() override {
    return (include_usage_ ? sse_event(formatter_.usage_chunk()) : "") + "data: [DONE]\n\n";
  }

 private:
  ResponseFormatter formatter_;
  bool include_usage_;
};

}  // namespace kvserve::server
