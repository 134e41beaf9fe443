// libFuzzer target: an HTTP request body as each endpoint parses it. The
// first byte picks the endpoint (completions, chat, tokenize, detokenize,
// Anthropic messages, count_tokens, OpenAI responses, vLLM's tokenize,
// llama-server's infill, Ollama's chat and generate), the rest is the body. Only ApiError 400 and
// kvserve::Error may come out (the server turns both into a 400 response).
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "server/anthropic_messages.h"
#include "server/api_error.h"
#include "server/infill_request.h"
#include "server/ollama_request.h"
#include "server/responses_request.h"
#include "server/request_parser.h"
#include "tests/tiny_vocab.h"
#include "tokenizer/chat_template.h"

using namespace kvserve;
using namespace kvserve::server;

namespace {

// As the server does: one parse, a schema's written key order copied during it.
void parse_generation(const RequestParser& parser, Endpoint endpoint, const std::string& text) {
  const RequestBody body = parse_request_body(text);
  ParsedRequest parsed = parser.parse(endpoint, body.tree);
  if (parsed.constraint) restore_key_order(*parsed.constraint, body.schemas_in_order);
}

void parse_generation_body(const RequestParser& parser, const nlohmann::json& body) {
  parser.parse(Endpoint::kCompletions, body);
}

// Ollama's /api/chat and /api/generate, as the server does them (format's key order kept, num_predict a bound).
void parse_ollama(const RequestParser& parser, bool chat, const std::string& text) {
  RequestBody body = parse_request_body(text, ollama_schema_paths());
  ollama_requested_model(body.tree);
  const OllamaGeneration g = chat ? generation_from_ollama_chat(body.tree, std::move(body.schemas_in_order))
                                  : generation_from_ollama_generate(body.tree, std::move(body.schemas_in_order));
  if (g.load_reason) return;
  ParsedRequest parsed = parser.parse(g.endpoint, g.body, MaxTokens::kAtMost);
  if (parsed.constraint) restore_key_order(*parsed.constraint, g.schemas_in_order);
}

void parse_request(const Tokenizer& tokenizer, const RequestParser& parser, uint8_t endpoint, const std::string& body) {
  switch (endpoint % 11) {
    case 0: parse_generation(parser, Endpoint::kCompletions, body); break;
    case 1: parse_generation(parser, Endpoint::kChat, body); break;
    case 2: tokenizer.encode(parse_tokenize_request(parse_json_body(body)).content, true); break;
    case 3: tokenizer.decode(parse_detokenize_request(parse_json_body(body), tokenizer.vocab_size())); break;
    case 4: parser.parse(Endpoint::kChat, chat_body_from_messages(parse_json_body(body))); break;  // /v1/messages
    case 5: parser.parse(Endpoint::kChat, chat_body_from_messages(parse_json_body(body), true)); break;  // count_tokens
    case 6: {  // /v1/responses, as the server does it (its schema's key order kept)
      const RequestBody parsed = parse_request_body(body, {responses_schema_path()});
      parser.parse(Endpoint::kChat, chat_body_from_responses(parsed.tree, nlohmann::json::array()));
      responses_settings(parsed.tree);
      break;
    }
    case 7: parser.vllm_tokenize(parse_json_body(body)); break;  // vLLM's /tokenize
    case 8: parse_generation_body(parser, completion_body_from_infill(parse_json_body(body), tokenizer, 256)); break;
    case 9: parse_ollama(parser, true, body); break;
    case 10: parse_ollama(parser, false, body); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  static const ChatTemplate chat_template = ChatTemplate::chatml();
  static const RequestParser parser(tokenizer, chat_template, 256);
  if (size == 0) return 0;
  try {
    parse_request(tokenizer, parser, data[0], std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
  } catch (const Error&) {
  }
  return 0;
}
