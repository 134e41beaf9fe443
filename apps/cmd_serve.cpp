// `kvserve serve`: the OpenAI-compatible HTTP server (docs/server.md).
// SIGINT / SIGTERM shut it down gracefully: stop accepting, let requests in
// flight finish for a grace period, cancel the rest, exit 0.
#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "apps/activations_flag.h"
#include "apps/rope_flags.h"
#include "apps/commands.h"
#include "apps/draft_flags.h"
#include "apps/pipeline.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/request_validation.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "server/api_server.h"
#include "server/keep_alive.h"
#include "server/model_memory.h"
#include "server/model_presets.h"
#include "server/model_router.h"
#include "server/open_file_limit.h"
#include "speculation/request_speculation.h"
#include "speculation/step_cost.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::cli {
namespace {

constexpr const char* kDefaultModel = "models/smollm2-135m-instruct-q4_1.gguf";

struct ServeOptions {
  RopeFlags rope;
  std::vector<std::string> models;  // -m, repeatable; none and no --models-dir: kDefaultModel
  std::string models_dir;           // --models-dir: every *.gguf in it
  int64_t models_max = 1;           // --models-max: models loaded at once (many models)
  double models_wait_seconds = 300; // --models-wait: a request's wait for a slot while every loaded model is busy
  std::string models_preset;        // --models-preset: an INI file of model ids and their options
  std::string models_memory;        // --models-memory: weights + KV pools of the loaded models at most ("" : none)
  std::string keep_alive = "5m";    // --keep-alive: many models: idle time before a model is unloaded
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> api_keys;       // --api-key, repeatable
  std::vector<std::string> api_key_files;  // --api-key-file, repeatable
  std::vector<std::string> cors_origins;   // --cors-origins
  size_t responses_store = 1024;           // --responses-store
  int64_t reasoning_budget = -1;           // --reasoning-budget
  bool no_webui = false;                   // --no-webui
  std::string alias;
  int64_t max_queue = 64;
  int64_t max_running = 16;
  int64_t context = 4096;
  int threads = 0;
  double grace_seconds = 10;
  double request_timeout_seconds = 30;  // a client's whole request (head + body) must arrive within this
  double idle_timeout_seconds = 10;     // a connection that sends nothing is closed after this
  int64_t max_body_bytes = 16 << 20;    // a larger request body gets 413
  double grammar_timeout_seconds = 10;  // a request waits this long for its grammar to compile (then 400)
  int64_t max_grammar_bytes = 256 * 1024;
  std::string kv_type = "f16";
  int64_t kv_mem_mib = 0;  // --kv-mem: the KV pool; 0: room for max-running full contexts, at most 1 GiB
  // Requests' default speculation (none | ngram | draft | auto); a request's "speculative" overrides it. auto
  // drafts only where it expects >= 1.05x, and measured no row below 0.99x (docs/speculative.md, issue 19).
  std::string spec = "auto";
  std::string draft;          // draft model file: enables speculative mode "draft"
  int64_t draft_k = 4;
  DraftFlags draft_flags;     // --draft-vocab, --draft-activations
  bool adaptive_k = false;
  PipelineFlags pipeline;     // --pipeline-parallel: this process is rank 0 of an mpirun, or a later stage
};

// Blocks the shutdown signals in every thread (threads inherit the mask), so
// that one watcher thread receives them with sigwait() and can do real work.
sigset_t block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must fail a write, not kill the server
  return set;
}

void serve_rank0(const ServeOptions& opt, const SpeculationSettings& spec_default, const sigset_t& signals,
                 const PipelineSession& pipeline);

void serve_many(const ServeOptions& opt, const SpeculationSettings& spec_default, const sigset_t& signals);

// The one model of a single-model server (-m once, or the default).
std::string single_model(const ServeOptions& opt) { return opt.models.empty() ? kDefaultModel : opt.models[0]; }
bool serves_many(const ServeOptions& opt) {
  return opt.models.size() > 1 || !opt.models_dir.empty() || !opt.models_preset.empty();
}

void warn_about_open_file_limit() {
  if (const size_t files = server::raise_open_file_limit(); files < server::kWantedOpenFiles)
    std::fprintf(stderr,
                 "kvserve: warning: at most %zu open files (the hard RLIMIT_NOFILE); the server cannot hold 1,000 "
                 "connections with fewer than %zu (raise it: ulimit -Hn, or LimitNOFILE= in a systemd unit)\n",
                 files, server::kWantedOpenFiles);
}

// The engine's settings from the flags, shared by the one-model and many-model servers (the draft model is
// each server's own).
EngineOptions engine_options_of(const ServeOptions& opt, const SpeculationSettings& spec_default) {
  EngineOptions engine_options;
  engine_options.max_context = opt.context;
  engine_options.max_queue = opt.max_queue;
  engine_options.max_running = opt.max_running;
  engine_options.kv_type = parse_kv_type(opt.kv_type, "--kv-type");
  engine_options.kv_memory_bytes = opt.kv_mem_mib << 20;
  engine_options.threads = opt.threads;
  engine_options.measure_step_cost = spec_default.mode == SpeculativeMode::kAuto;
  return engine_options;
}

// The server's settings from the flags, shared by the one-model and many-model servers.
server::ServerOptions server_options_of(const ServeOptions& opt, const SpeculationSettings& spec_default,
                                        std::vector<std::string> api_keys) {
  server::ServerOptions server_options;
  server_options.host = opt.host;
  server_options.port = opt.port;
  server_options.api_keys = std::move(api_keys);
  server_options.cors_origins = opt.cors_origins;
  server_options.responses_store = opt.responses_store;
  server_options.reasoning_budget = opt.reasoning_budget;
  server_options.webui = !opt.no_webui;
  server_options.shutdown_grace = std::chrono::milliseconds(static_cast<int64_t>(opt.grace_seconds * 1000));
  server_options.speculation = spec_default;
  server_options.connections.request_deadline =
      std::chrono::milliseconds(static_cast<int64_t>(opt.request_timeout_seconds * 1000));
  server_options.connections.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.idle_timeout_seconds * 1000));
  server_options.connections.max_body_bytes = static_cast<size_t>(opt.max_body_bytes);
  return server_options;
}

void serve(const ServeOptions& opt) {
  if (opt.threads < 0) throw Error("--threads must be >= 0, got " + std::to_string(opt.threads));
  if (serves_many(opt)) {
    if (opt.pipeline.ranks > 1) throw Error("--pipeline-parallel serves one model: give -m once, no --models-dir");
    if (!opt.draft.empty()) throw Error("--draft needs one model (-m once): with several, give each its draft in --models-preset");
    if (!opt.alias.empty()) throw Error("--alias names one model (-m once); with several, each id is its file name or its --models-preset section");
  }
  const SpeculationSettings spec_default{parse_speculative_mode(opt.spec), opt.draft_k, opt.adaptive_k};
  validate_speculation(spec_default, !opt.draft.empty());
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  if (serves_many(opt)) {
    const sigset_t signals = block_shutdown_signals();
    serve_many(opt, spec_default, signals);
    return;
  }
  // Before MPI starts its threads: every thread must leave the signals to the watcher.
  const sigset_t signals = block_shutdown_signals();
  PipelineSession pipeline(opt.pipeline);
  pipeline.guard([&] {
    if (pipeline.rank() != 0) {  // no watcher here: mpirun's SIGTERM ends a later stage at once
      pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
      return pipeline.run_stage(single_model(opt), opt.rope.apply({}));
    }
    serve_rank0(opt, spec_default, signals, pipeline);
  });
}

// The server, or rank 0 of a pipelined one: a lost rank fails the requests
// it was running and shuts the server down with the error.
void serve_rank0(const ServeOptions& opt, const SpeculationSettings& spec_default, const sigset_t& signals,
                 const PipelineSession& pipeline) {
  // Before the model loads: a missing key file fails at once.
  std::vector<std::string> api_keys = server::collect_api_keys(opt.api_keys, opt.api_key_files, std::getenv("KVSERVE_API_KEY"));
  auto model = Model::load(single_model(opt), pipeline.load_options(opt.rope.apply({})));
  // Requests in draft mode draft with it; the Engine refuses a draft with another vocabulary.
  const std::unique_ptr<Model> draft = opt.draft.empty() ? nullptr : Model::load(opt.draft, opt.draft_flags.load_options());
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  std::string template_note;
  ChatTemplate chat_template = ChatTemplate::for_model(model->file(), &template_note);
  EngineOptions engine_options = engine_options_of(opt, spec_default);
  engine_options.draft_model = draft.get();
  // A lost rank (on the engine thread): its error, and a wake-up for the watcher once it runs.
  std::mutex failure_mutex;
  std::string pipeline_failure;
  std::optional<pthread_t> watcher_thread;
  engine_options.pipeline = pipeline.engine_options([&](const std::string& error) {
    std::fprintf(stderr, "kvserve: error: %s; shutting down\n", error.c_str());
    std::lock_guard lock(failure_mutex);
    pipeline_failure = error;
    if (watcher_thread) pthread_kill(*watcher_thread, SIGTERM);
  });
  Engine engine(*model, tokenizer, engine_options);
  if (!engine.step_cost_at_start().empty()) {
    const std::string cost = format_step_cost(engine.step_cost_at_start());
    std::fprintf(stderr, "kvserve: step cost measured for auto speculation: %s\n", cost.c_str());
  }

  server::ServerOptions server_options = server_options_of(opt, spec_default, std::move(api_keys));
  server_options.model_id = opt.alias.empty() ? std::filesystem::path(single_model(opt)).stem().string() : opt.alias;
  warn_about_open_file_limit();
  server_options.constraints.compile_timeout_seconds = opt.grammar_timeout_seconds;
  server_options.constraints.max_spec_bytes = static_cast<size_t>(opt.max_grammar_bytes);
  server::ApiServer server(engine, *model, tokenizer, std::move(chat_template), server_options);
  const int port = server.bind();

  std::thread watcher([&] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    std::fprintf(stderr, "kvserve: signal %d, shutting down\n", signal_number);
    server.shutdown();
  });
  {
    std::lock_guard lock(failure_mutex);
    watcher_thread = watcher.native_handle();
    if (!pipeline_failure.empty()) pthread_kill(*watcher_thread, SIGTERM);
  }
  // The pool may hold fewer tokens than -c asks (a small --kv-mem): say so before a 400 does.
  const int64_t context = engine.request_limits().context;
  if (context < std::min(opt.context, model->config().context_length))
    std::fprintf(stderr, "kvserve: the KV pool holds %lld tokens, so a sequence's context is %lld, not -c %lld "
                 "(raise --kv-mem)\n", static_cast<long long>(engine.metrics().kv_blocks_total * engine_options.block_size),
                 static_cast<long long>(context), static_cast<long long>(opt.context));
  std::fprintf(stderr, "kvserve: %s; serving %s on http://%s:%d%s\n", template_note.c_str(),
               server_options.model_id.c_str(), opt.host.c_str(), port, opt.no_webui ? "" : " (chat page at /)");
  server.listen();
  // listen() also returns when serving failed; wake the watcher so that it
  // shuts down (a no-op after a signal) and can be joined.
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  pipeline.report(*model);
  std::lock_guard lock(failure_mutex);
  if (!pipeline_failure.empty()) throw Error(pipeline_failure);
  std::fprintf(stderr, "kvserve: stopped\n");
}

// The models of a many-model server: --models-dir's files, -m's, then the presets file's sections (a section
// naming a model already listed sets its options; one with `model` adds a model or replaces the listed one's file).
std::vector<server::ModelSource> model_sources(const ServeOptions& opt) {
  std::vector<server::ModelSource> sources;
  if (!opt.models_dir.empty()) sources = server::models_in_dir(opt.models_dir);
  for (const std::string& path : opt.models) {
    if (!std::filesystem::is_regular_file(path)) throw Error("-m " + path + ": no such file");
    sources.push_back({std::filesystem::path(path).stem().string(), path, {}});
  }
  if (opt.models_preset.empty()) return sources;
  const server::ModelPresets presets = server::load_model_presets(opt.models_preset);
  for (const server::ModelPreset& p : presets.models) {
    auto listed = std::find_if(sources.begin(), sources.end(), [&](const server::ModelSource& s) { return s.id == p.id; });
    if (p.path.empty() && listed == sources.end())
      throw Error(opt.models_preset + ":" + std::to_string(p.line) + ": [" + p.id + "] has no `model = FILE` and " +
                  "no -m or --models-dir file has that id");
    if (!p.path.empty() && !std::filesystem::is_regular_file(p.path))
      throw Error(opt.models_preset + ":" + std::to_string(p.line) + ": [" + p.id + "] model = " + p.path +
                  ": no such file");
    if (listed == sources.end()) listed = sources.insert(sources.end(), {p.id, p.path, {}});
    if (!p.path.empty()) listed->path = p.path;
    listed->options = p.options;
  }
  for (server::ModelSource& s : sources) s.options = s.options.or_else(presets.defaults);
  return sources;
}

server::RouterLimits router_limits(const ServeOptions& opt) {
  server::RouterLimits limits;
  limits.max_loaded = static_cast<size_t>(opt.models_max);
  limits.slot_wait = std::chrono::milliseconds(static_cast<int64_t>(opt.models_wait_seconds * 1000));
  if (!opt.models_memory.empty()) limits.memory_budget = parse_byte_size(opt.models_memory, "--models-memory");
  const std::optional<server::KeepAlive> keep_alive = server::parse_keep_alive(opt.keep_alive);
  if (!keep_alive)
    throw Error("--keep-alive " + opt.keep_alive + ": expected a duration such as 5m, 30s, 1h30m, 0 or -1 (forever)");
  limits.keep_alive = *keep_alive;
  return limits;
}

// Many models (-m A -m B, --models-dir, --models-preset): a ModelRouter loads each on demand (docs/server.md,
// "Many models").
void serve_many(const ServeOptions& opt, const SpeculationSettings& spec_default, const sigset_t& signals) {
  std::vector<std::string> api_keys = server::collect_api_keys(opt.api_keys, opt.api_key_files, std::getenv("KVSERVE_API_KEY"));
  std::vector<server::ModelSource> sources = model_sources(opt);
  if (sources.empty()) throw Error("--models-dir " + opt.models_dir + " holds no *.gguf file");
  EngineOptions engine_options = engine_options_of(opt, spec_default);

  for (const server::ModelSource& s : sources) server::model_setup(s.id, s.options, engine_options, spec_default);
  server::ServerOptions server_options = server_options_of(opt, spec_default, std::move(api_keys));
  warn_about_open_file_limit();
  server_options.constraints.compile_timeout_seconds = opt.grammar_timeout_seconds;
  server_options.constraints.max_spec_bytes = static_cast<size_t>(opt.max_grammar_bytes);
  const server::RouterLimits limits = router_limits(opt);
  std::string ids;
  for (const server::ModelSource& s : sources) ids += (ids.empty() ? "" : ", ") + s.id;
  server::ApiServer server(std::move(sources), limits, opt.rope.apply({}), engine_options, server_options,
                           opt.draft_flags.load_options());
  const int port = server.bind();
  std::thread watcher([&] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    std::fprintf(stderr, "kvserve: signal %d, shutting down\n", signal_number);
    server.shutdown();
  });
  const std::string budget = limits.memory_budget > 0 ? ", within " + server::format_bytes(limits.memory_budget) : "";
  std::fprintf(stderr,
               "kvserve: serving %s (loaded on demand, at most %lld at once%s, idle ones unloaded after %s) on "
               "http://%s:%d%s\n",
               ids.c_str(), static_cast<long long>(opt.models_max), budget.c_str(),
               server::keep_alive_text(limits.keep_alive).c_str(), opt.host.c_str(), port,
               opt.no_webui ? "" : " (chat page at /)");
  server.listen();
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  std::fprintf(stderr, "kvserve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto opt = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  add_activations_flag(cmd);
  opt->rope.add_to(cmd);
  cmd->add_option("-m,--model", opt->models,
                  std::string("GGUF model file (default ") + kDefaultModel + "); repeat it to serve several, each "
                  "loaded when a request names it (its id: the file name without .gguf)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--models-dir", opt->models_dir,
                  "Serve every *.gguf in this folder (with any -m), each loaded when a request's \"model\" names it "
                  "(its id: the file name without .gguf)");
  cmd->add_option("--models-max", opt->models_max,
                  "Many models: at most this many loaded at once; the least recently used idle one is unloaded first")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  cmd->add_option("--models-wait", opt->models_wait_seconds,
                  "Many models: seconds a request waits for a slot while every loaded model is busy (then 503)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--models-preset", opt->models_preset,
                  "Many models: an INI file, one [id] section per model (its alias) with model = FILE and options "
                  "named as these flags (ctx-size, kv-type, kv-mem, threads, draft, spec, draft-k); [*]: every "
                  "model's defaults (docs/server.md, \"Presets file\")");
  cmd->add_option("--models-memory", opt->models_memory,
                  "Many models: the loaded models' weights + KV pools at most (8G, 512M, 6GiB, bytes); idle ones are "
                  "unloaded, least recently used first, to make room. Default: no budget");
  cmd->add_option("--keep-alive", opt->keep_alive,
                  "Many models: how long a model stays loaded after its last request when the request gives no "
                  "keep_alive (5m, 30s, 1h; 0: unload at once; -1: forever). One model (-m once) is never unloaded")
      ->capture_default_str();
  cmd->add_option("--host", opt->host, "Address to bind")->capture_default_str();
  cmd->add_option("--port", opt->port, "Port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", opt->api_keys,
                  "Require this key of every request but /health (Authorization: Bearer <key> or x-api-key: <key>); "
                  "repeatable. Other users see it in ps: prefer --api-key-file or KVSERVE_API_KEY")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--api-key-file", opt->api_key_files,
                  "Accept each key in this file (one per line; blank lines and # comments skipped); repeatable. "
                  "KVSERVE_API_KEY (keys separated by commas) adds more; every key given is accepted")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--cors-origins", opt->cors_origins,
                  "Let browser pages of these origins call the API (scheme://host[:port], comma-separated or "
                  "repeated; * for any): their answers carry Access-Control-Allow-Origin and preflight OPTIONS "
                  "requests are answered. Default: none")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--responses-store", opt->responses_store,
                  "Responses API: keep the latest N responses for previous_response_id and GET /v1/responses/{id} "
                  "(at most 64 MiB; the oldest are forgotten first; 0 keeps none)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--reasoning-budget", opt->reasoning_budget,
                  "Reasoning models: tokens of thinking before the end tag (</think>) is forced, for requests "
                  "without thinking_token_budget (-1: no budget; 0: the answer at once)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_flag("--no-webui", opt->no_webui,
                "Do not serve the chat page at / (nor its /webui.js, /webui_util.js, /webui.css): those paths "
                "answer 404");
  cmd->add_option("--alias", opt->alias, "Model id reported by the API (default: the file name)");
  cmd->add_option("--max-queue", opt->max_queue, "Waiting requests before 429")->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--max-running", opt->max_running, "Sequences decoded together")->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", opt->context, "Context size per sequence (capped at the model's)")
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("-t,--threads", opt->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--kv-type", opt->kv_type, "KV cache element type: f32, f16, bf16, q8_0, fp8, q4_0")
      ->capture_default_str();
  cmd->add_option("--kv-mem", opt->kv_mem_mib,
                  "KV pool MiB, shared by every sequence through paged blocks (0: room for --max-running full "
                  "contexts, at most 1 GiB); `kvserve kv-size` says what fits")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))->capture_default_str();
  cmd->add_option("--shutdown-grace", opt->grace_seconds, "Seconds requests may run on after SIGINT/SIGTERM")
      ->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  cmd->add_option("--request-timeout", opt->request_timeout_seconds,
                  "Seconds a client has to send its whole request (then 408)")
      ->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  cmd->add_option("--idle-timeout", opt->idle_timeout_seconds, "Seconds a connection may stay open sending nothing")
      ->check(CLI::Range(0.1, 3600.0))->capture_default_str();
  cmd->add_option("--max-body-bytes", opt->max_body_bytes, "Largest request body accepted, in bytes (then 413)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 30))->capture_default_str();
  cmd->add_option("--grammar-timeout", opt->grammar_timeout_seconds,
                  "Seconds a request waits for its schema / regex / grammar to compile (then 400; the compile is cached)")
      ->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  cmd->add_option("--max-grammar-bytes", opt->max_grammar_bytes, "Largest schema / regex / grammar accepted, in bytes")
      ->check(CLI::Range(int64_t{1}, int64_t{64} << 20))->capture_default_str();
  cmd->add_option("--spec", opt->spec,
                  "Default speculative decoding of requests: none, ngram (prompt lookup), draft (needs --draft) or "
                  "auto (each step whichever of them is expected to pay, k up to --draft-k); "
                  "a request's \"speculative\" field overrides it")
      ->check(CLI::IsMember({"none", "ngram", "draft", "auto"}))
      ->capture_default_str();
  cmd->add_option("--draft", opt->draft,
                  "Draft model (same vocabulary as the target) for requests in speculative mode \"draft\"");
  cmd->add_option("--draft-k", opt->draft_k, "Drafts verified per pass at most (speculative requests)")
      ->check(CLI::Range(int64_t{1}, kMaxEngineDraftK))
      ->capture_default_str();
  add_draft_flags(cmd, opt->draft_flags);
  cmd->add_flag("--adaptive-k", opt->adaptive_k, "Shrink a request's draft length when its drafts are rejected");
  add_pipeline_flags(cmd, opt->pipeline);
  cmd->callback([opt] { serve(*opt); });
}

}  // namespace kvserve::cli
