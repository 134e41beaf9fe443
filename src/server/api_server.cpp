#include "server/api_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "grammar/spec_limits.h"
#include "server/anthropic_encoder.h"
#include "server/anthropic_messages.h"
#include "server/api_error.h"
#include "server/infill_request.h"
#include "server/json_input.h"
#include "server/llama_server_encoder.h"
#include "server/ollama_request.h"
#include "server/responses_encoder.h"
#include "server/responses_request.h"
#include "server/gated_http_server.h"
#include "server/generation_response.h"
#include "server/open_file_limit.h"
#include "server/response_format.h"
#include "server/tool_constraint.h"
#include "server/webui.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

constexpr time_t kKeepAliveSeconds = 2;
// httplib 0.11 listens with a backlog of 5: a burst of clients overflows it
// and the kernel resets some of them. bind() widens it.
constexpr int kListenBacklog = 1024;  // also bounds how long listen() waits on idle connections at shutdown
constexpr const char* kServerVersion = "0.1.0";  // what GET /version reports

bool is_messages_path(const std::string& path) { return path.starts_with("/v1/messages"); }
bool is_ollama_path(const std::string& path) { return path.starts_with("/api/"); }

// The one place an error becomes an HTTP response: Anthropic's error shape
// on its Messages paths, Ollama's on its /api/ paths, OpenAI's everywhere else.
void write_error(const httplib::Request& req, httplib::Response& res, const ApiError& error) {
  res.status = error.status();
  if (error.status() == 429 || error.status() == 503) res.set_header("Retry-After", "1");
  if (error.status() == 401) res.set_header("WWW-Authenticate", "Bearer");
  json body = is_messages_path(req.path) ? messages_error_body(error)
              : is_ollama_path(req.path) ? ollama_error_body(error)
                                         : error_body(error);
  res.set_content(dump_json(body), "application/json");
}

void write_json(httplib::Response& res, const json& body) { res.set_content(dump_json(body), "application/json"); }

json parse_body(const httplib::Request& req) { return parse_json_body(req.body); }

// Answered at once, without waiting on the engine: served by workers of their
// own, so that they never queue behind streaming responses.
bool is_quick_request(const std::string& method, const std::string& target) {
  if (method != "GET") return false;
  const std::string path = target.substr(0, target.find('?'));
  return path == "/health" || path == "/metrics" || path == "/version" || path == "/v1/models" ||
         path == "/api/version" || path == "/api/tags" || path == "/api/ps" || is_webui_path(path);
}

size_t worker_threads(const EngineOptions& engine) {
  // Every waiting or running request holds a worker while it streams (the
  // engine refuses more with 429); clients still sending their request and
  // quick requests hold none of these.
  return static_cast<size_t>(std::clamp<int64_t>(engine.max_queue + engine.max_running + 8, 8, 1024));
}

}  // namespace

ApiServer::ApiServer(Engine& engine, const Model& model, const Tokenizer& tokenizer, ChatTemplate chat_template,
                     ServerOptions options)
    : engine_(engine),
      model_(model),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      options_(std::move(options)),
      api_keys_(options_.api_keys),
      cors_(options_.cors_origins),
      responses_(options_.responses_store, options_.responses_store_bytes),
      context_(std::min(engine.options().max_context, model.config().context_length)),
      parser_(tokenizer_, chat_template_, context_, options_.speculation, engine.options().draft_model != nullptr,
              engine.request_limits()),
      ollama_model_(model, options_.model_id, context_, chat_template_),
      constraints_(tokenizer_, model.config().vocab_size, options_.constraints),
      http_(std::make_unique<GatedHttpServer>(options_.connections, worker_threads(engine.options()), is_quick_request)) {
  http_->set_payload_max_length(options_.connections.max_body_bytes);
  http_->set_keep_alive_timeout(kKeepAliveSeconds);
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = sock;
  });
  if (std::optional<ReasoningSyntax> syntax = reasoning_syntax_for(chat_template_.source()))
    reasoning_tags_ = ReasoningTags::of(tokenizer_, syntax->start, syntax->end);
  install_routes();
}

ApiServer::~ApiServer() { shutdown(); }

void ApiServer::install_routes() {
  httplib::Server& s = *http_;
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
    write_error(req, res, classify_exception(error));
  });
  // httplib's own refusals (unknown route, oversized body) come with no body; give them the error shape too.
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string what = res.status == 404 ? "no route for " + req.method + " " + req.path
                                               : "the request was refused (HTTP " + std::to_string(res.status) + ")";
    write_error(req, res, ApiError(res.status, what));
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    cors_.add_headers(req, res);  // first: every answer carries them, refusals included
    // A browser's preflight carries no credentials: it is answered before the key is asked for.
    if (cors_.answer_preflight(req, res)) return httplib::Server::HandlerResponse::Handled;
    check_api_key(req);
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.Post("/v1/completions", [this](const auto& req, auto& res) { handle_generation(Endpoint::kCompletions, req, res); });
  s.Post("/v1/chat/completions", [this](const auto& req, auto& res) { handle_generation(Endpoint::kChat, req, res); });
  s.Post("/v1/messages", [this](const auto& req, auto& res) { handle_messages(req, res); });
  s.Post("/v1/messages/count_tokens", [this](const auto& req, auto& res) { handle_count_tokens(req, res); });
  s.Post("/v1/responses", [this](const auto& req, auto& res) { handle_responses(req, res); });
  s.Post("/infill", [this](const auto& req, auto& res) { handle_infill(req, res); });
  s.Get(R"(/v1/responses/([A-Za-z0-9_-]+))", [this](const auto& req, auto& res) { handle_stored_response(req, res, false); });
  s.Delete(R"(/v1/responses/([A-Za-z0-9_-]+))", [this](const auto& req, auto& res) { handle_stored_response(req, res, true); });
  s.Get("/v1/models", [this](const auto&, auto& res) { handle_models(res); });
  install_ollama_routes();
  if (options_.webui) install_webui_routes(s);
  s.Post("/tokenize", [this](const auto& req, auto& res) { handle_tokenize(req, res); });
  s.Post("/detokenize", [this](const auto& req, auto& res) { handle_detokenize(req, res); });
  s.Get("/health", [this](const auto&, auto& res) {
    res.status = draining_ ? 503 : 200;
    write_json(res, {{"status", draining_ ? "shutting down" : "ok"}});
  });
  s.Get("/metrics", [this](const auto&, auto& res) {
    res.set_content(metrics_.render(engine_.metrics(), options_.model_id, engine_.options().block_size),
                    "text/plain; version=0.0.4");
  });
  // vLLM's endpoint: SGLang's router (smg) registers an HTTP worker only once
  // /v1/models, /version or /server_info tells it the engine, and reads a
  // "vllm" worker's load from the vllm: gauges in /metrics (docs/scaling.md).
  s.Get("/version", [](const auto&, auto& res) {
    write_json(res, {{"version", kServerVersion}, {"server", "kvserve"}});
  });
}

void ApiServer::install_ollama_routes() {
  httplib::Server& s = *http_;
  s.Post("/api/chat", [this](const auto& req, auto& res) { handle_ollama_generation(OllamaShape::kChat, req, res); });
  s.Post("/api/generate", [this](const auto& req, auto& res) { handle_ollama_generation(OllamaShape::kGenerate, req, res); });
  s.Post("/api/show", [this](const auto& req, auto& res) { handle_ollama_show(req, res); });
  s.Get("/api/tags", [this](const auto&, auto& res) { write_json(res, ollama_model_.tags()); });
  s.Get("/api/ps", [this](const auto&, auto& res) { write_json(res, ollama_model_.ps()); });
  s.Get("/api/version", [](const auto&, auto& res) { write_json(res, {{"version", kOllamaApiVersion}}); });
  for (const char* path : {"/api/embed", "/api/embeddings"})
    s.Post(path, [](const auto&, auto&) {
      throw ApiError(404, "embeddings are not implemented: kvserve serves text generation only", {}, "not_found_error");
    });
}

void ApiServer::check_api_key(const httplib::Request& req) const {
  // The chat page holds no secret; it asks for the key and sends it with its API calls.
  if (api_keys_.empty() || req.path == "/health" || (options_.webui && is_webui_path(req.path))) return;
  if (!api_keys_.accepts_headers(req.get_header_value("Authorization"), req.get_header_value("x-api-key")))
    throw ApiError(401, "missing or wrong API key: send it as \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"", {},
                   "authentication_error");
}

void ApiServer::handle_generation(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const RequestBody body = parse_request_body(req.body);  // the body's one parse
  ParsedRequest parsed = prepare(endpoint, body.tree, body.schemas_in_order);
  auto encoder = std::make_unique<OpenAiEncoder>(ResponseFormatter(tokenizer_, parsed, options_.model_id),
                                                 parsed.include_usage);
  run(std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_messages(const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const json chat_body = chat_body_from_messages(parse_json_body(req.body));
  std::optional<ParsedRequest> parsed_chat;
  try {
    parsed_chat = prepare(Endpoint::kChat, chat_body, {});
  } catch (const ApiError& e) {
    throw as_messages_error(e);
  }
  ParsedRequest parsed = std::move(*parsed_chat);
  auto encoder = std::make_unique<AnthropicEncoder>(parsed, options_.model_id);
  run(std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_count_tokens(const httplib::Request& req, httplib::Response& res) const {
  const json chat_body = chat_body_from_messages(parse_json_body(req.body), true);
  std::optional<ParsedRequest> parsed;
  try {
    parsed = parser_.parse(Endpoint::kChat, chat_body);
  } catch (const ApiError& e) {
    throw as_messages_error(e);
  }
  write_json(res, {{"input_tokens", parsed->requests.at(0).request().prompt.size()}});
}

void ApiServer::handle_responses(const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const RequestBody body = parse_request_body(req.body, {responses_schema_path()});
  json history = json::array();
  const json* previous = field(body.tree, "previous_response_id");
  if (previous && !previous->is_null()) {
    if (!previous->is_string()) throw invalid("previous_response_id", "previous_response_id must be a string");
    std::optional<ResponseStore::Entry> entry = responses_.get(previous->get<std::string>());
    if (!entry)
      throw invalid("previous_response_id", "no stored response has the id " + previous->get<std::string>() +
                                                " (the store keeps the latest " + std::to_string(options_.responses_store) +
                                                " responses stored with store: true)");
    history = std::move(entry->conversation);
  }
  const json chat_body = chat_body_from_responses(body.tree, history);
  std::optional<ParsedRequest> parsed_chat;
  try {
    parsed_chat = prepare(Endpoint::kChat, chat_body, schemas_for_chat_body(body.schemas_in_order));
  } catch (const ApiError& e) {
    throw as_responses_error(e);
  }
  ParsedRequest parsed = std::move(*parsed_chat);
  const bool store = field(body.tree, "store") == nullptr || *field(body.tree, "store") != false;
  json conversation = history;
  for (json& m : responses_input_messages(body.tree)) conversation.push_back(std::move(m));
  auto finished = [this, store, conversation = std::move(conversation)](const json& response, const json& answer) mutable {
    if (!store) return;
    conversation.push_back(answer);
    responses_.put(response["id"].get<std::string>(), {response, std::move(conversation)});
  };
  auto encoder = std::make_unique<ResponsesEncoder>(parsed, tokenizer_, options_.model_id,
                                                    responses_settings(body.tree), std::move(finished));
  run(std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_infill(const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const json completion = completion_body_from_infill(parse_json_body(req.body), tokenizer_, context_);
  ParsedRequest parsed = prepare(Endpoint::kCompletions, completion, {});
  run(std::move(parsed), std::make_unique<LlamaServerEncoder>(options_.model_id), arrival, req, res);
}

void ApiServer::handle_ollama_generation(OllamaShape shape, const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  RequestBody body = parse_request_body(req.body, ollama_schema_paths());
  const std::string requested = ollama_requested_model(body.tree);
  ollama_model_.check_requested(requested);
  const std::string model_name = requested.empty() ? ollama_model_.name() : requested;  // Ollama echoes the name given
  const OllamaGeneration generation = shape == OllamaShape::kChat
                                          ? generation_from_ollama_chat(body.tree, std::move(body.schemas_in_order))
                                          : generation_from_ollama_generate(body.tree, std::move(body.schemas_in_order));
  if (generation.load_reason) {  // nothing to generate: the model is loaded already, and stays so
    write_json(res, ollama_load_answer(shape, model_name, *generation.load_reason));
    return;
  }
  std::optional<ParsedRequest> parsed;
  try {
    parsed = prepare(generation.endpoint, generation.body, generation.schemas_in_order, MaxTokens::kAtMost);
  } catch (const ApiError& e) {
    throw as_ollama_error(e);
  }
  if (generation.thinking_asked && !parsed->template_reasons)
    throw invalid("think", "\"" + model_name + "\" does not support thinking");
  auto encoder = std::make_unique<OllamaEncoder>(*parsed, shape, model_name, arrival);
  run(std::move(*parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_ollama_show(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_json_body(req.body);
  std::string requested = ollama_requested_model(body);
  if (requested.empty() && body.contains("name")) requested = ollama_requested_model({{"model", body["name"]}});
  ollama_model_.check_requested(requested);
  write_json(res, ollama_model_.show());
}

void ApiServer::handle_stored_response(const httplib::Request& req, httplib::Response& res, bool erase) {
  const std::string id = req.matches[1];
  if (erase) {
    if (!responses_.erase(id)) throw ApiError(404, "no stored response has the id " + id);
    write_json(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
    return;
  }
  std::optional<ResponseStore::Entry> entry = responses_.get(id);
  if (!entry) throw ApiError(404, "no stored response has the id " + id);
  write_json(res, entry->response);
}

ParsedRequest ApiServer::prepare(Endpoint endpoint, const json& body, const KeyOrderCapture::Copies& schemas_in_order,
                                 MaxTokens max_tokens) {
  ParsedRequest parsed = parser_.parse(endpoint, body, max_tokens);
  if (parsed.tools && parsed.constraint &&
      (parsed.tools->choice.kind == ToolChoice::kRequired || parsed.tools->choice.kind == ToolChoice::kNamed))
    throw invalid("tool_choice", "a required tool call cannot also follow " + parsed.constraint->param);
  if (parsed.tools && parsed.tools->calls_allowed()) check_tool_schemas(*parsed.tools);
  if (parsed.tools && !parsed.constraint)
    if (std::optional<ConstraintSpec> calls = tool_call_constraint(*parsed.tools, parsed.tool_format))
      parsed.constraint = ConstraintParam{std::move(*calls), "tools", {}};
  std::shared_ptr<const CompiledConstraint> compiled;
  if (parsed.constraint) {  // compiled here, in the request's thread: the engine never waits for a compile
    restore_key_order(*parsed.constraint, schemas_in_order);
    compiled = compile_constraint(*parsed.constraint);
  }
  const int64_t budget = parsed.reasoning_budget.value_or(options_.reasoning_budget);
  if (parsed.template_reasons && reasoning_tags_ && (compiled || budget >= 0))
    compiled = gate_after_reasoning(*reasoning_tags_, tokenizer_, std::move(compiled), {parsed.reasoning_open, budget});
  if (compiled)
    for (ValidatedRequest& r : parsed.requests) r.set_constraint(compiled);
  return parsed;
}

void ApiServer::run(ParsedRequest parsed, std::unique_ptr<ResponseEncoder> encoder, Clock::time_point arrival,
                    const httplib::Request& req, httplib::Response& res) {
  const bool stream = parsed.stream;
  auto job = std::make_shared<GenerationJob>(engine_, metrics_, jobs_, std::move(parsed.requests), arrival);
  if (stream) send_event_stream(std::move(job), std::move(encoder), metrics_, res);
  else send_whole_response(*job, *encoder, ClientConnection(http_->socket_of(req)), metrics_, res);
}

std::shared_ptr<const CompiledConstraint> ApiServer::compile_constraint(const ConstraintParam& constraint) {
  try {
    return constraints_.compile(constraint.spec);
  } catch (const ConstraintError& e) {
    if (e.reason() == ConstraintError::Reason::kBusy) throw ApiError(503, e.what(), constraint.param, "server_error");
    if (e.reason() == ConstraintError::Reason::kTooLarge) throw invalid(constraint.param, constraint.param + ": " + e.what());
    throw invalid(constraint.param, e.what());
  }
}

// A tool's parameters become part of the calls' grammar: the same caps as a
// response_format schema, named by the tool.
void ApiServer::check_tool_schemas(const ToolRequest& tools) const {
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    try {
      check_schema_limits(tools.tools[i].parameters, constraints_.limits());
    } catch (const ConstraintError& e) {
      throw invalid(param, param + ": " + e.what());
    }
  }
}

void ApiServer::handle_models(httplib::Response& res) const {
  const ModelConfig& c = model_.config();
  json model = {{"id", options_.model_id},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "kvserve"},
                {"meta", {{"architecture", c.arch}, {"context_length", context_}, {"vocab_size", c.vocab_size},
                          {"layers", c.n_layers}}}};
  write_json(res, {{"object", "list"}, {"data", json::array({model})}});
}

void ApiServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) const {
  const json body = parse_body(req);
  if (body.is_object() && (body.contains("prompt") || body.contains("messages"))) {  // vLLM's shape
    const std::vector<int32_t> ids = parser_.vllm_tokenize(body);
    json out = {{"count", ids.size()}, {"max_model_len", parser_.context()}, {"tokens", ids}, {"token_strs", nullptr}};
    if (field(body, "return_token_strs") && *field(body, "return_token_strs") == true) {
      out["token_strs"] = json::array();
      for (int32_t id : ids) out["token_strs"].push_back(tokenizer_.token_bytes(id));
    }
    write_json(res, out);
    return;
  }
  const TokenizeRequest request = parse_tokenize_request(body);  // llama-server's shape
  const std::vector<int32_t> ids = parser_.tokenize(request);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (request.with_pieces) tokens.push_back({{"id", id}, {"piece", tokenizer_.token_bytes(id)}});
    else tokens.push_back(id);
  }
  write_json(res, {{"tokens", tokens}});
}

// llama-server answers {"content"}, vLLM {"prompt"}: both are given.
void ApiServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) const {
  const std::string text = tokenizer_.decode(parser_.detokenize_ids(parse_body(req)));
  write_json(res, {{"content", text}, {"prompt", text}});
}

int ApiServer::bind() {
  raise_open_file_limit();  // each held connection is a descriptor
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                                      : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0) throw Error("cannot listen on " + options_.host + ":" + std::to_string(options_.port));
  ::listen(listen_socket_, kListenBacklog);  // on a listening socket this only updates the backlog
  return port;
}

void ApiServer::listen() { http_->listen_after_bind(); }

void ApiServer::shutdown() {
  if (shut_down_.exchange(true)) return;
  draining_ = true;  // from now on new generation requests get 503
  if (!jobs_.wait_until_empty(options_.shutdown_grace)) {
    jobs_.cancel_all();
    jobs_.wait_until_empty(std::chrono::minutes(1));
  }
  // Only now: httplib ends the streams in progress when it stops.
  http_->close_gate();
  http_->stop();  // listen() returns once the last handlers are done
  engine_.shutdown(false);
}

}  // namespace kvserve::server
