#pragma once
// OpenAI's Responses API (POST /v1/responses) as a translation onto the chat
// path: a request's `instructions`, `input` items and stored history become
// the chat body they stand for (one parser, one engine path); the answer is
// written by ResponsesEncoder (responses_encoder.h).
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_key_order.h"

namespace kvserve::server {

// The chat body of a Responses request: `history` (the chat messages of the
// response named by previous_response_id, or an empty list) then `input` (a
// string, or items: messages with input_text / output_text parts,
// function_call, function_call_output, reasoning), with `instructions` as the
// system message; tools (function) and tool_choice, text.format (json_schema,
// json_object) as response_format, reasoning.effort as reasoning_effort,
// max_output_tokens as max_tokens, temperature, top_p, parallel_tool_calls,
// stream. Throws ApiError 400 naming the Responses field.
nlohmann::json chat_body_from_responses(const nlohmann::json& body, const nlohmann::json& history);

// The chat messages the request adds to its history (its input, without the
// instructions: a later response does not inherit them, as in OpenAI's API).
nlohmann::json responses_input_messages(const nlohmann::json& body);

// A chat parser's error named as the Responses request names the field
// (max_output_tokens, text.format, input, reasoning.effort, tools[i].parameters).
ApiError as_responses_error(const ApiError& error);

// The request's settings a response object echoes, with OpenAI's defaults:
// instructions, tools, tool_choice, parallel_tool_calls, temperature, top_p,
// text, reasoning, max_output_tokens, previous_response_id, store, metadata.
nlohmann::json responses_settings(const nlohmann::json& body);

// Where a Responses request's json_schema is: captured in written key order
// while the body is parsed (json_key_order.h), then moved to the chat body's
// response_format path.
KeyPath responses_schema_path();
KeyOrderCapture::Copies schemas_for_chat_body(KeyOrderCapture::Copies responses_copies);

}  // namespace kvserve::server
