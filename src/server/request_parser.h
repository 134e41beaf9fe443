#pragma once
// Turns the JSON bodies of /v1/completions and /v1/chat/completions into
// engine requests, checking every field and naming the one at fault
// (throws ApiError with status 400).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/request_validation.h"
#include "server/chat_template_capabilities.h"
#include "server/constraint_param.h"
#include "server/json_input.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::server {

enum class Endpoint { kCompletions, kChat };

// How a body's max_tokens is read: OpenAI's exact count (more than the
// prompt leaves of the context is a 400; completions default to 16), or an
// upper bound cut to what the prompt leaves, all of it by default (Ollama's
// num_predict).
enum class MaxTokens { kExact, kAtMost };

// A request body as JSON; throws ApiError 400 for text that is not JSON or
// nests deeper than kMaxJsonDepth (server/json_input.h).
nlohmann::json parse_json_body(const std::string& body);

// A generation request's body, parsed once: its tree, and the schemas it
// gives as objects also in their written key order (restore_key_order).
struct RequestBody {
  nlohmann::json tree;
  KeyOrderCapture::Copies schemas_in_order;
};
// Throws as parse_json_body does. `schema_paths`: where the schemas are
// (by default those of the chat and completions bodies).
RequestBody parse_request_body(const std::string& body, std::vector<KeyPath> schema_paths = {});

// POST /tokenize: {"content": str, "add_special"?: bool, "with_pieces"?: bool}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false;
  bool with_pieces = false;
};
TokenizeRequest parse_tokenize_request(const nlohmann::json& body);
// POST /detokenize: {"tokens": [ids]}, each id in [0, vocab_size), at most max_tokens of them.
std::vector<int32_t> parse_detokenize_request(const nlohmann::json& body, int32_t vocab_size,
                                              int64_t max_tokens = kMaxJsonValues);

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // One engine request per prompt, each with n sequences: prompt i's choice j
  // (sequence j of requests[i]) is choice i * n + j of the response.
  std::vector<ValidatedRequest> requests;  // checked against the engine's limits while parsing
  std::vector<std::string> prompt_texts;  // per prompt, for echo
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt text precedes the completion
  bool logprobs = false;
  int32_t prompt_logprobs = -1;  // vLLM's prompt_logprobs (-1: not asked): choices[i].prompt_logprobs
  // What the output must follow (response_format, structured_outputs, ...);
  // compiled by the server outside the engine thread.
  std::optional<ConstraintParam> constraint;
  // Chat: the request's tools (nullopt without any) and the format the
  // model writes calls in (from its chat template).
  std::optional<ToolRequest> tools;
  ToolCallFormat tool_format = ToolCallFormat::kGenericJson;
  // Chat with a reasoning model: its reasoning's syntax (nullopt: none, or
  // "reasoning_format": "none"), and whether the prompt opened the block.
  std::optional<ReasoningSyntax> reasoning;
  bool reasoning_open = false;
  // The template's model reasons: the engine-side gate (an output constraint
  // only after the thinking; the thinking budget) applies whatever
  // reasoning_format says (grammar/reasoning_gate.h).
  bool template_reasons = false;
  // thinking_token_budget (vLLM) or thinking_budget: tokens of thinking before
  // the end tag is forced (-1: no budget); nullopt: the server's --reasoning-budget.
  std::optional<int64_t> reasoning_budget;

  size_t choices() const { return requests.size() * static_cast<size_t>(n); }
};

class RequestParser {
 public:
  // context: tokens per sequence (prompt + completion) the engine allows;
  // speculation: the default of requests without a "speculative" field;
  // has_draft_model: whether "mode": "draft" can run (the engine has a draft model);
  // engine_limits: what the engine checks requests against (Engine::request_limits();
  // by default the vocabulary, context and draft model above).
  RequestParser(const Tokenizer& tokenizer, const ChatTemplate& chat_template, int64_t context,
                SpeculationSettings speculation = {}, bool has_draft_model = false,
                std::optional<RequestLimits> engine_limits = std::nullopt)
      : tokenizer_(tokenizer), chat_template_(chat_template),
        template_capabilities_(ChatTemplateCapabilities::of(chat_template)), context_(context),
        speculation_(speculation), has_draft_model_(has_draft_model),
        engine_limits_(engine_limits.value_or(RequestLimits{tokenizer.vocab_size(), context, has_draft_model})) {}

  // Every count is checked before anything is tokenized: prompts x n, each
  // prompt's bytes against what the context can hold (check_text_fits). Each
  // engine request is then validated with the engine's limits (a
  // ValidatedRequest, which Engine::submit_validated does not check again).
  ParsedRequest parse(Endpoint endpoint, const nlohmann::json& body, MaxTokens max_tokens = MaxTokens::kExact) const;

  // POST /tokenize's ids, at most `context` of them (400 past that; a text
  // certainly longer is refused before it is tokenized).
  std::vector<int32_t> tokenize(const TokenizeRequest& request) const;
  // vLLM's POST /tokenize: {"prompt": str, "add_special_tokens"?: bool (true)}
  // or {"messages": [...], "add_generation_prompt"?, "continue_final_message"?,
  // "chat_template_kwargs"?, "tools"?} (the chat prompt's ids); at most `context`.
  std::vector<int32_t> vllm_tokenize(const nlohmann::json& body) const;
  int64_t context() const { return context_; }
  // POST /detokenize's ids, at most `context` of them.
  std::vector<int32_t> detokenize_ids(const nlohmann::json& body) const;

  // How a chat conversation becomes its prompt.
  struct ChatPromptOptions {
    const ToolRequest* tools = nullptr;  // offered to the model (when tool_choice is not "none")
    nlohmann::json variables = nlohmann::json::object();  // template variables: chat_template_kwargs, reasoning_effort
    bool add_generation_prompt = true;    // the assistant's header after the messages
    // The final (assistant) message is continued: the prompt ends with its text, no end of turn (assistant prefill).
    bool continue_final_message = false;
  };
  // The prompt tokens of a chat conversation (the template applied).
  std::vector<int32_t> chat_prompt(const nlohmann::json& messages, std::string* text,
                                   const ChatPromptOptions& options) const;
  std::vector<int32_t> chat_prompt(const nlohmann::json& messages, std::string* text,
                                   const ToolRequest* tools = nullptr) const {
    return chat_prompt(messages, text, ChatPromptOptions{tools});
  }

 private:
  struct Prompts {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::string> texts;
  };
  Prompts completion_prompts(const nlohmann::json& prompt) const;
  Prompts infill_prompts(const nlohmann::json& prompt, const nlohmann::json& suffix) const;
  std::vector<int32_t> checked_tokens(const nlohmann::json& ids, const std::string& param) const;
  GenerationRequest shared_settings(Endpoint endpoint, const nlohmann::json& body, ParsedRequest& out) const;
  void fit_to_context(const std::vector<int32_t>& prompt, const nlohmann::json& body, Endpoint endpoint,
                      MaxTokens policy, GenerationRequest& r) const;
  ValidatedRequest validate_for_engine(GenerationRequest r, Endpoint endpoint) const;

  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_template_;
  ChatTemplateCapabilities template_capabilities_;
  int64_t context_;
  SpeculationSettings speculation_;
  bool has_draft_model_;
  RequestLimits engine_limits_;
};

}  // namespace kvserve::server
