#pragma once
// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a
// translation onto the chat path: a request becomes the OpenAI chat body it
// stands for (one parser, one engine path); AnthropicEncoder
// (anthropic_encoder.h) writes the answer in Anthropic's shapes.
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace kvserve::server {

// The chat completions body a Messages request stands for: system blocks
// become the system message, text / tool_use / tool_result / thinking blocks
// become content, tool_calls, tool messages and reasoning_content,
// stop_sequences become stop, tools' input_schema their parameters,
// tool_choice auto / any / tool / none OpenAI's, thinking enabled / disabled
// the template's enable_thinking. max_tokens is required unless
// `counting` (count_tokens). Throws ApiError 400 naming the Messages field.
nlohmann::json chat_body_from_messages(const nlohmann::json& body, bool counting = false);

// A chat parser's error named as the Messages request names the field.
ApiError as_messages_error(const ApiError& error);

// {"type": "error", "error": {"type", "message"}}: Anthropic's error body;
// the status decides the type (invalid_request_error, authentication_error,
// not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error).
nlohmann::json messages_error_body(const ApiError& error);

}  // namespace kvserve::server
