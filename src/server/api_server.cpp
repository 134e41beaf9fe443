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
#include "server/metric_labels.h"
#include "server/ollama_request.h"
#include "server/responses_encoder.h"
#include "server/responses_request.h"
#include "server/gated_http_server.h"
#include "server/generation_response.h"
#include "server/open_file_limit.h"
#include "server/response_format.h"
#include "server/rfc3339_time.h"
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
// The "model" a request body names ("" when it names none).
std::string requested_model(const json& body) {
  const json* v = body.is_object() ? field(body, "model") : nullptr;
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

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
    : ApiServer(std::move(options), engine.options(), [&](const ServerOptions& o) {
        return std::make_unique<ModelRouter>(std::make_shared<ServedModel>(
            o.model_id, engine, model, tokenizer, std::move(chat_template), ServedModelSettings{o.speculation, o.constraints}));
      }) {}

ApiServer::ApiServer(std::vector<ModelSource> models, RouterLimits limits, ModelLoadOptions load_options,
                     EngineOptions engine_options, ServerOptions options, ModelLoadOptions draft_load_options)
    : ApiServer(std::move(options), engine_options, [&](const ServerOptions& o) {
        const ServedModelSettings settings{o.speculation, o.constraints};
        ModelLoader loader = [load_options, draft_load_options, engine_options, settings](const ModelSource& source) {
          const ModelSetup setup = model_setup(source.id, source.options, engine_options, settings.speculation);
          return ServedModel::load(source.id, source.path, load_options, setup.engine,
                                   {setup.speculation, settings.constraints}, setup.draft_path, draft_load_options);
        };
        ModelSizer sizer = [engine_options, speculation = o.speculation](const ModelSource& source) {
          const ModelSetup setup = model_setup(source.id, source.options, engine_options, speculation);
          return estimate_model_memory(source.path, setup.draft_path, setup.engine);
        };
        return std::make_unique<ModelRouter>(std::move(models), limits, std::move(loader), std::move(sizer));
      }) {}

ApiServer::ApiServer(ServerOptions options, const EngineOptions& engine_options,
                     const std::function<std::unique_ptr<ModelRouter>(const ServerOptions&)>& make_router)
    : options_(std::move(options)),
      api_keys_(options_.api_keys),
      cors_(options_.cors_origins),
      responses_(options_.responses_store, options_.responses_store_bytes),
      router_(make_router(options_)),
      http_(std::make_unique<GatedHttpServer>(options_.connections, worker_threads(engine_options), is_quick_request)) {
  http_->set_payload_max_length(options_.connections.max_body_bytes);
  http_->set_keep_alive_timeout(kKeepAliveSeconds);
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = sock;
  });
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
  s.Get("/metrics", [this](const auto&, auto& res) { handle_metrics(res); });
  install_router_routes();
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
  s.Get("/api/tags", [this](const auto&, auto& res) { handle_ollama_tags(res); });
  s.Get("/api/ps", [this](const auto&, auto& res) { handle_ollama_ps(res); });
  s.Get("/api/version", [](const auto&, auto& res) { write_json(res, {{"version", kOllamaApiVersion}}); });
  for (const char* path : {"/api/embed", "/api/embeddings"})
    s.Post(path, [](const auto&, auto&) {
      throw ApiError(404, "embeddings are not implemented: kvserve serves text generation only", {}, "not_found_error");
    });
}

void ApiServer::install_router_routes() {
  httplib::Server& s = *http_;
  s.Post("/models/load", [this](const auto& req, auto& res) { handle_model_load(req, res, true); });
  s.Post("/models/unload", [this](const auto& req, auto& res) { handle_model_load(req, res, false); });
}

ModelRouter::Lease ApiServer::lease(const std::string& requested, std::optional<KeepAlive> keep_alive) {
  return router_->acquire(requested, keep_alive);
}

ModelRouter::Lease ApiServer::lease_for_generation(const json& body) {
  return lease(requested_model(body), keep_alive_field(body));
}

void ApiServer::handle_model_load(const httplib::Request& req, httplib::Response& res, bool load) {
  const json body = parse_body(req);
  const std::string requested = requested_model(body);
  if (requested.empty()) throw invalid("model", "\"model\" (the id of a model /v1/models lists) is required");
  if (load) {
    if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
    const ModelRouter::Lease m = lease(requested);
    write_json(res, {{"success", true}, {"model", m->id}, {"status", "loaded"}});
    return;
  }
  const std::string& id = router_->resolve(requested);
  write_json(res, {{"success", true}, {"model", id}, {"status", router_->unload(requested)}});
}

void ApiServer::handle_metrics(httplib::Response& res) {
  if (!router_->fixed()) {
    res.set_content(many_model_metrics(), "text/plain; version=0.0.4");
    return;
  }
  const ModelRouter::Lease m = router_->entries(true).at(0).model;  // the one model, always loaded
  res.set_content(metrics_.render(m->engine.metrics(), options_.model_id, m->engine.options().block_size),
                  "text/plain; version=0.0.4");
}

std::string ApiServer::many_model_metrics() {
  std::vector<std::pair<std::string, std::string>> engines;  // (model id, its engine's series)
  std::string memory;  // kvserve:model_memory_bytes{model="id"} of each loaded model
  for (const ModelRouter::Entry& e : router_->entries(true)) {
    if (!e.model) continue;
    const EngineMetrics m = e.model->engine.metrics();
    engines.emplace_back(e.id, ServerMetrics::render_engine(m) +
                                   ServerMetrics::render_engine_vllm(m, e.id, e.model->engine.options().block_size));
    memory += "kvserve:model_memory_bytes{model=\"" + prometheus_label_value(e.id) + "\"} " + std::to_string(e.memory) + "\n";
  }
  std::string text = merge_labelled(engines, "model") + metrics_.render_server();
  const RouterCounters c = router_->counters();
  auto counter_line = [&](const std::string& name, const char* type, const std::string& help, int64_t value) {
    text += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + std::to_string(value) + "\n";
  };
  counter_line("kvserve:models_loaded", "gauge", "Models loaded now (--models-max at most).", static_cast<int64_t>(c.loaded));
  counter_line("kvserve:model_loads_total", "counter", "Models loaded.", static_cast<int64_t>(c.loads));
  counter_line("kvserve:model_unloads_total", "counter", "Models unloaded.", static_cast<int64_t>(c.unloads));
  counter_line("kvserve:model_load_failures_total", "counter", "Model loads that failed.", static_cast<int64_t>(c.load_failures));
  counter_line("kvserve:models_memory_budget_bytes", "gauge", "--models-memory (0: no budget).", c.memory_budget);
  counter_line("kvserve:models_memory_used_bytes", "gauge", "Weights + KV pools counted for the loaded and loading models.",
         c.memory_used);
  text += "# HELP kvserve:model_memory_bytes Weights + KV pools of each loaded model.\n"
          "# TYPE kvserve:model_memory_bytes gauge\n" + memory;
  return text;
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
  ModelRouter::Lease m = lease_for_generation(body.tree);
  ParsedRequest parsed = prepare(*m, endpoint, body.tree, body.schemas_in_order);
  auto encoder = std::make_unique<OpenAiEncoder>(ResponseFormatter(m->tokenizer, parsed, m->id), parsed.include_usage);
  run(std::move(m), std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_messages(const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const json messages_body = parse_json_body(req.body);
  const json chat_body = chat_body_from_messages(messages_body);
  std::optional<ParsedRequest> parsed_chat;
  ModelRouter::Lease m;
  try {
    m = lease_for_generation(messages_body);
    parsed_chat = prepare(*m, Endpoint::kChat, chat_body, {});
  } catch (const ApiError& e) {
    throw as_messages_error(e);
  }
  ParsedRequest parsed = std::move(*parsed_chat);
  auto encoder = std::make_unique<AnthropicEncoder>(parsed, m->id);
  run(std::move(m), std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_count_tokens(const httplib::Request& req, httplib::Response& res) const {
  const json messages_body = parse_json_body(req.body);
  const json chat_body = chat_body_from_messages(messages_body, true);
  std::optional<ParsedRequest> parsed;
  try {
    const ModelRouter::Lease m = router_->acquire(requested_model(messages_body));
    parsed = m->parser.parse(Endpoint::kChat, chat_body);
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
  ModelRouter::Lease m;
  try {
    m = lease_for_generation(body.tree);
    parsed_chat = prepare(*m, Endpoint::kChat, chat_body, schemas_for_chat_body(body.schemas_in_order));
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
  auto encoder = std::make_unique<ResponsesEncoder>(parsed, m->tokenizer, m->id, responses_settings(body.tree),
                                                    std::move(finished));
  run(std::move(m), std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_infill(const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  const json infill_body = parse_json_body(req.body);
  ModelRouter::Lease m = lease_for_generation(infill_body);
  const json completion = completion_body_from_infill(infill_body, m->tokenizer, m->context);
  ParsedRequest parsed = prepare(*m, Endpoint::kCompletions, completion, {});
  auto encoder = std::make_unique<LlamaServerEncoder>(m->id);
  run(std::move(m), std::move(parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_ollama_generation(OllamaShape shape, const httplib::Request& req, httplib::Response& res) {
  const Clock::time_point arrival = Clock::now();
  if (draining_) throw ApiError(503, "the server is shutting down", {}, "server_error");
  RequestBody body = parse_request_body(req.body, ollama_schema_paths());
  const std::string requested = ollama_requested_model(body.tree);
  // An unknown name: 404 (naming the served model, or every available one).
  if (router_->fixed()) lease(requested)->ollama.check_requested(requested);
  else if (!requested.empty()) router_->resolve(requested);
  const OllamaGeneration generation = shape == OllamaShape::kChat
                                          ? generation_from_ollama_chat(body.tree, std::move(body.schemas_in_order))
                                          : generation_from_ollama_generate(body.tree, std::move(body.schemas_in_order));
  if (generation.load_reason && *generation.load_reason == "unload" && !router_->fixed() && !requested.empty()) {
    router_->unload(requested);  // keep_alive 0 with nothing to generate: unloaded now, or once its requests end
    write_json(res, ollama_load_answer(shape, requested, *generation.load_reason));
    return;
  }
  // With nothing to generate, this is Ollama's way to load it; keep_alive holds from when its requests end.
  const Clock::time_point leasing = Clock::now();
  ModelRouter::Lease m = lease(requested, generation.keep_alive);
  const Clock::duration load = router_->fixed() ? Clock::duration{} : Clock::now() - leasing;
  const std::string model_name = requested.empty() ? m->ollama.name() : requested;  // Ollama echoes the name given
  if (generation.load_reason) {  // nothing to generate: the model is loaded now (a single -m: it stays so)
    write_json(res, ollama_load_answer(shape, model_name, *generation.load_reason));
    return;
  }
  std::optional<ParsedRequest> parsed;
  try {
    parsed = prepare(*m, generation.endpoint, generation.body, generation.schemas_in_order, MaxTokens::kAtMost);
  } catch (const ApiError& e) {
    throw as_ollama_error(e);
  }
  if (generation.thinking_asked && !parsed->template_reasons)
    throw invalid("think", "\"" + model_name + "\" does not support thinking");
  auto encoder = std::make_unique<OllamaEncoder>(*parsed, shape, model_name, arrival, load);
  run(std::move(m), std::move(*parsed), std::move(encoder), arrival, req, res);
}

void ApiServer::handle_ollama_show(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  std::string requested = ollama_requested_model(body);
  if (requested.empty() && body.contains("name")) requested = ollama_requested_model({{"model", body["name"]}});
  const ModelRouter::Lease m = lease(requested);
  if (router_->fixed()) m->ollama.check_requested(requested);
  write_json(res, m->ollama.show());
}

void ApiServer::handle_ollama_tags(httplib::Response& res) {
  json models = json::array();
  for (const ModelRouter::Entry& e : router_->entries(true))
    models.push_back(e.model ? e.model->ollama.tags()["models"][0] : ollama_unloaded_entry(e.id, e.path));
  write_json(res, {{"models", models}});
}

void ApiServer::handle_ollama_ps(httplib::Response& res) {
  json models = json::array();
  const auto steady_now = std::chrono::steady_clock::now();
  for (const ModelRouter::Entry& e : router_->entries(true)) {
    if (!e.model) continue;
    json model = e.model->ollama.ps()["models"][0];
    if (e.expires_at)  // idle with a finite keep_alive: when the keep_alive thread unloads it
      model["expires_at"] = rfc3339_utc(std::chrono::system_clock::now() +
                                        std::chrono::duration_cast<std::chrono::system_clock::duration>(*e.expires_at - steady_now));
    models.push_back(std::move(model));
  }
  write_json(res, {{"models", models}});
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

ParsedRequest ApiServer::prepare(ServedModel& m, Endpoint endpoint, const json& body,
                                 const KeyOrderCapture::Copies& schemas_in_order, MaxTokens max_tokens) {
  ParsedRequest parsed = m.parser.parse(endpoint, body, max_tokens);
  if (parsed.tools && parsed.constraint &&
      (parsed.tools->choice.kind == ToolChoice::kRequired || parsed.tools->choice.kind == ToolChoice::kNamed))
    throw invalid("tool_choice", "a required tool call cannot also follow " + parsed.constraint->param);
  if (parsed.tools && parsed.tools->calls_allowed()) check_tool_schemas(m, *parsed.tools);
  if (parsed.tools && !parsed.constraint)
    if (std::optional<ConstraintSpec> calls = tool_call_constraint(*parsed.tools, parsed.tool_format))
      parsed.constraint = ConstraintParam{std::move(*calls), "tools", {}};
  std::shared_ptr<const CompiledConstraint> compiled;
  if (parsed.constraint) {  // compiled here, in the request's thread: the engine never waits for a compile
    restore_key_order(*parsed.constraint, schemas_in_order);
    compiled = compile_constraint(m, *parsed.constraint);
  }
  const int64_t budget = parsed.reasoning_budget.value_or(options_.reasoning_budget);
  if (parsed.template_reasons && m.reasoning_tags && (compiled || budget >= 0))
    compiled = gate_after_reasoning(*m.reasoning_tags, m.tokenizer, std::move(compiled), {parsed.reasoning_open, budget});
  if (compiled)
    for (ValidatedRequest& r : parsed.requests) r.set_constraint(compiled);
  return parsed;
}

void ApiServer::run(ModelRouter::Lease m, ParsedRequest parsed, std::unique_ptr<ResponseEncoder> encoder,
                    Clock::time_point arrival, const httplib::Request& req, httplib::Response& res) {
  const bool stream = parsed.stream;
  Engine& engine = m->engine;
  // The job holds the lease: the model stays loaded until the answer is sent (or the stream ends).
  auto job = std::make_shared<GenerationJob>(engine, metrics_, jobs_, std::move(parsed.requests), arrival, std::move(m));
  if (stream) send_event_stream(std::move(job), std::move(encoder), metrics_, res);
  else send_whole_response(*job, *encoder, ClientConnection(http_->socket_of(req)), metrics_, res);
}

std::shared_ptr<const CompiledConstraint> ApiServer::compile_constraint(ServedModel& m,
                                                                       const ConstraintParam& constraint) {
  try {
    return m.constraints.compile(constraint.spec);
  } catch (const ConstraintError& e) {
    if (e.reason() == ConstraintError::Reason::kBusy) throw ApiError(503, e.what(), constraint.param, "server_error");
    if (e.reason() == ConstraintError::Reason::kTooLarge) throw invalid(constraint.param, constraint.param + ": " + e.what());
    throw invalid(constraint.param, e.what());
  }
}

// A tool's parameters become part of the calls' grammar: the same caps as a
// response_format schema, named by the tool.
void ApiServer::check_tool_schemas(const ServedModel& m, const ToolRequest& tools) const {
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    try {
      check_schema_limits(tools.tools[i].parameters, m.constraints.limits());
    } catch (const ConstraintError& e) {
      throw invalid(param, param + ": " + e.what());
    }
  }
}

void ApiServer::handle_models(httplib::Response& res) {
  json data = json::array();
  for (const ModelRouter::Entry& e : router_->entries(true)) {
    json model = {{"id", router_->fixed() ? options_.model_id : e.id}, {"object", "model"}, {"created", 0},
                  {"owned_by", "kvserve"}};
    if (e.model) {
      const ModelConfig& c = e.model->model.config();
      model["meta"] = {{"architecture", c.arch}, {"context_length", e.model->context}, {"vocab_size", c.vocab_size},
                       {"layers", c.n_layers}};
    }
    // Many models: whether each is loaded (llama-server's router reports {"status": {"value": ...}}).
    if (!router_->fixed()) model["status"] = {{"value", e.status}};
    data.push_back(std::move(model));
  }
  write_json(res, {{"object", "list"}, {"data", data}});
}

void ApiServer::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req);
  const ModelRouter::Lease m = lease(requested_model(body));
  const RequestParser& parser = m->parser;
  const Tokenizer& tokenizer = m->tokenizer;
  if (body.is_object() && (body.contains("prompt") || body.contains("messages"))) {  // vLLM's shape
    const std::vector<int32_t> ids = parser.vllm_tokenize(body);
    json out = {{"count", ids.size()}, {"max_model_len", parser.context()}, {"tokens", ids}, {"token_strs", nullptr}};
    if (field(body, "return_token_strs") && *field(body, "return_token_strs") == true) {
      out["token_strs"] = json::array();
      for (int32_t id : ids) out["token_strs"].push_back(tokenizer.token_bytes(id));
    }
    write_json(res, out);
    return;
  }
  const TokenizeRequest request = parse_tokenize_request(body);  // llama-server's shape
  const std::vector<int32_t> ids = parser.tokenize(request);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (request.with_pieces) tokens.push_back({{"id", id}, {"piece", tokenizer.token_bytes(id)}});
    else tokens.push_back(id);
  }
  write_json(res, {{"tokens", tokens}});
}

// llama-server answers {"content"}, vLLM {"prompt"}: both are given.
void ApiServer::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  const json body = parse_body(req);
  const ModelRouter::Lease m = lease(requested_model(body));
  const std::string text = m->tokenizer.decode(m->parser.detokenize_ids(body));
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
  router_->shutdown();
}

}  // namespace kvserve::server
