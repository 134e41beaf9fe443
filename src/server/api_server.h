#pragma once
// The OpenAI-compatible HTTP server over an Engine (see docs/server.md):
// /v1/completions, /v1/chat/completions (both with SSE streaming),
// /v1/models, /health, /version, /tokenize, /detokenize and /metrics; a chat
// page at / (server/webui.h); and
// Anthropic's Messages, OpenAI's Responses and Ollama's /api/ endpoints
// translated onto the same path.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "grammar/constraint_compiler.h"
#include "grammar/reasoning_gate.h"
#include "model/model.h"
#include "server/api_keys.h"
#include "server/connection_gate.h"
#include "server/cors.h"
#include "server/generation_job.h"
#include "server/model_router.h"
#include "server/ollama_encoder.h"
#include "server/ollama_models.h"
#include "server/request_parser.h"
#include "server/response_encoder.h"
#include "server/response_store.h"
#include "server/server_metrics.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvserve::server {

class GatedHttpServer;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port (bind() says which)
  // When any, every endpoint but /health needs one: "Authorization: Bearer <key>" or "x-api-key: <key>".
  std::vector<std::string> api_keys;
  std::string model_id;     // the id /v1/models reports and responses echo
  std::chrono::milliseconds shutdown_grace{10000};  // how long shutdown() lets requests finish before cancelling them
  SpeculationSettings speculation;  // for requests without a "speculative" field (serve --spec ngram --draft-k K)
  ConnectionGateLimits connections;  // deadlines and sizes for clients still sending their request
  ConstraintLimits constraints;      // sizes and compile time of response_format / structured_outputs
  // Origins whose browser pages may call the API ("*": any; empty: none): --cors-origins, server/cors.h.
  std::vector<std::string> cors_origins;
  // The Responses API's store (previous_response_id, GET /v1/responses/{id}): --responses-store N responses,
  // at most this many bytes; the oldest are forgotten first (server/response_store.h).
  size_t responses_store = 1024;
  size_t responses_store_bytes = size_t{64} << 20;
  // Reasoning models: tokens of thinking before the end tag is forced, for requests that give no
  // thinking_token_budget (--reasoning-budget; -1: no budget).
  int64_t reasoning_budget = -1;
  // GET / serves the chat page (server/webui.h) and its scripts and style; --no-webui: off (404).
  bool webui = true;
};

class ApiServer {
 public:
  // One model: the engine, model and tokenizer must outlive the server.
  ApiServer(Engine& engine, const Model& model, const Tokenizer& tokenizer, ChatTemplate chat_template,
            ServerOptions options);
  // Many models (serve -m A -m B, --models-dir; docs/server.md "Many models"): each loaded on demand with these
  // options (a model's preset options over them: model_setup), at most limits.max_loaded at once and within
  // limits.memory_budget; draft_load_options load the draft models presets name. options.model_id is not used.
  ApiServer(std::vector<ModelSource> models, RouterLimits limits, ModelLoadOptions load_options,
            EngineOptions engine_options, ServerOptions options, ModelLoadOptions draft_load_options = {});
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket; returns the port. Throws kvserve::Error when it cannot.
  int bind();
  // Serves until shutdown(); returns once the requests in flight are answered.
  void listen();
  // Refuses new generation requests (503), lets those in flight finish for
  // the grace period, cancels the rest, stops listening and shuts the engine
  // down. Safe to call from any thread (a signal-watching one), more than once.
  void shutdown();

 private:
  // The router is made once options_ is set (from it).
  ApiServer(ServerOptions options, const EngineOptions& engine_options,
            const std::function<std::unique_ptr<ModelRouter>(const ServerOptions&)>& make_router);
  void install_routes();
  void install_router_routes();
  void install_ollama_routes();
  void check_api_key(const httplib::Request& req) const;
  void handle_generation(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  // Anthropic's Messages API: translated onto the chat path (anthropic_messages.h).
  void handle_messages(const httplib::Request& req, httplib::Response& res);
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res) const;
  // OpenAI's Responses API: translated onto the chat path (responses_request.h), answers kept in responses_.
  void handle_responses(const httplib::Request& req, httplib::Response& res);
  // llama-server's fill-in-the-middle endpoint (infill_request.h), answered in its own shape.
  void handle_infill(const httplib::Request& req, httplib::Response& res);
  void handle_stored_response(const httplib::Request& req, httplib::Response& res, bool erase);
  // Ollama's /api/chat and /api/generate: translated onto the chat or completions path (ollama_request.h).
  void handle_ollama_generation(OllamaShape shape, const httplib::Request& req, httplib::Response& res);
  void handle_ollama_show(const httplib::Request& req, httplib::Response& res);
  void handle_ollama_tags(httplib::Response& res);
  void handle_ollama_ps(httplib::Response& res);
  void handle_metrics(httplib::Response& res);
  // A many-model server's: each loaded model's engine series labelled {model="id"}, and the router's.
  std::string many_model_metrics();
  // POST /models/load and /models/unload (llama-server's router): {"model": "..."}.
  void handle_model_load(const httplib::Request& req, httplib::Response& res, bool load);
  // The model a request names (its "model"; "": the default), loaded: throws ApiError (model_router.h).
  ModelRouter::Lease lease(const std::string& requested, std::optional<KeepAlive> keep_alive = std::nullopt);
  // The model a generation body names, leased with the body's keep_alive (Ollama's field, taken on every
  // generating path; llama-server has none, other servers ignore it).
  ModelRouter::Lease lease_for_generation(const nlohmann::json& body);
  // A generation body parsed, its tool-call grammar added and its constraint compiled; throws ApiError.
  ParsedRequest prepare(ServedModel& m, Endpoint endpoint, const nlohmann::json& body, const KeyOrderCapture::Copies& schemas_in_order,
                        MaxTokens max_tokens = MaxTokens::kExact);
  // Submits the parsed requests and answers in the encoder's shape, streamed or whole.
  void run(ModelRouter::Lease m, ParsedRequest parsed, std::unique_ptr<ResponseEncoder> encoder, Clock::time_point arrival,
           const httplib::Request& req, httplib::Response& res);
  // The compiled constraint of a request's response_format etc. (cached); throws ApiError.
  std::shared_ptr<const CompiledConstraint> compile_constraint(ServedModel& m, const ConstraintParam& constraint);
  // The caps of a constraint on each tool's parameters schema; throws ApiError 400 naming the tool.
  void check_tool_schemas(const ServedModel& m, const ToolRequest& tools) const;
  void handle_models(httplib::Response& res);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);

  ServerOptions options_;
  ApiKeys api_keys_;
  CorsPolicy cors_;
  ResponseStore responses_;
  // The served models (one fixed model for a single -m): before http_, whose handlers hold leases.
  std::unique_ptr<ModelRouter> router_;
  ServerMetrics metrics_;
  JobRegistry jobs_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> shut_down_{false};
  int listen_socket_ = -1;  // recorded while binding, to widen the listen backlog
  std::unique_ptr<GatedHttpServer> http_;
};

}  // namespace kvserve::server
