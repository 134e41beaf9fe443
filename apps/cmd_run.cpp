// `kvserve run`: generate text from a prompt with one sequence, streaming to
// stdout; load time and prompt / generation speed go to stderr. With
// -f FILE (one prompt a line) the prompts run together through the
// continuous-batching Engine (--parallel at a time) and print in order.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "apps/activations_flag.h"
#include "apps/rope_flags.h"
#include "apps/commands.h"
#include "apps/draft_flags.h"
#include "apps/pipeline.h"
#include "core/error.h"
#include "decode/decoder.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "speculation/model_drafter.h"
#include "speculation/ngram_drafter.h"
#include "speculation/request_speculation.h"
#include "speculation/speculative_session.h"
#include "speculation/step_cost.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::cli {
namespace {

struct RunOptions {
  RopeFlags rope;
  std::string model = "models/smollm2-135m-instruct-q4_1.gguf";
  std::string prompt = "Once upon a time";
  int64_t n_predict = 128;
  int64_t context = 4096;
  int threads = 0;
  std::string decoder = "cached";
  std::string kv_type = "f16";
  bool ignore_eos = false;
  bool no_echo = false;
  bool chat = false;  // --chat: each prompt as one user turn through the model's chat template
  std::shared_ptr<const ChatTemplate> chat_template;  // set after the model loads when `chat`
  int64_t seed = -1;
  SamplingParams sampling;
  std::string prompts_file;  // -f: one prompt a line, run through the Engine
  int64_t parallel = 8;      // sequences decoded together with -f
  // Speculative decoding (docs/speculative.md).
  std::string spec = "none";  // none | draft | ngram
  std::string draft;          // draft model file ("": the target's first --draft-layers layers)
  int64_t draft_k = 5;
  int64_t draft_layers = 6;
  DraftFlags draft_flags;     // --draft-vocab, --draft-activations
  bool adaptive_k = false;
  bool keep_sliding_kv = false;  // -f: sliding-window layers keep every position (EngineOptions::sliding_window_kv off)
  PipelineFlags pipeline;     // --pipeline-parallel: -p and -f run through the engine
};

void set_threads(int threads) {
  if (threads < 0) throw Error("--threads must be positive, got " + std::to_string(threads));
  if (threads > 0) omp_set_num_threads(threads);
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open the prompts file '" + path + "'");
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) prompts.push_back(line);
  if (prompts.empty()) throw Error("the prompts file '" + path + "' has no prompts");
  return prompts;
}

// The engine's speculation counters, when any request speculated.
void print_speculation(const RunOptions& opt, const Engine& engine) {
  const EngineMetrics m = engine.metrics();
  if (!engine.step_cost_at_start().empty()) {
    const std::string cost = format_step_cost(engine.step_cost_at_start());
    std::fprintf(stderr, "step cost at start (auto speculation): %s\n", cost.c_str());
  }
  if (m.spec_rounds == 0) return;
  const auto d = [](int64_t v) { return static_cast<double>(v); };
  std::fprintf(stderr, "speculative: %s, k %lld%s | verifications: %lld | drafts accepted: %lld of %lld (%.1f%%) | "
               "accepted per verification: %.2f\n",
               opt.spec.c_str(), static_cast<long long>(opt.draft_k), opt.adaptive_k ? " (adaptive)" : "",
               static_cast<long long>(m.spec_rounds), static_cast<long long>(m.spec_accepted_tokens),
               static_cast<long long>(m.spec_draft_tokens),
               100.0 * d(m.spec_accepted_tokens) / std::max(d(m.spec_draft_tokens), 1.0),
               d(m.spec_accepted_tokens) / d(m.spec_rounds));
}

// The draft: another model file, or the target's own first layers (same
// mapped weights, no copy) when --draft is not given.
std::unique_ptr<Model> load_draft(const RunOptions& opt, const Model& target) {
  const int64_t layers = target.layer_range().total;  // the whole file's, also on a pipeline's rank 0
  if (opt.draft.empty() && (opt.draft_layers < 1 || opt.draft_layers > layers))
    throw Error("--draft-layers must be in [1, " + std::to_string(layers) + "], got " +
                std::to_string(opt.draft_layers));
  const ModelLoadOptions draft_options = opt.draft_flags.load_options(opt.draft.empty() ? opt.draft_layers : 0);
  auto draft = Model::load(opt.draft.empty() ? opt.model : opt.draft, draft_options);
  check_same_vocabulary(target, *draft);
  return draft;
}

// The engine's options for run -f / a pipelined run -p; `draft` receives the
// draft model, which must outlive the engine.
EngineOptions run_engine_options(const RunOptions& opt, const Model& model, int64_t max_queue,
                                 const PipelineSession& pipeline, std::unique_ptr<Model>& draft) {
  EngineOptions eo;
  eo.max_context = std::min(opt.context, model.config().context_length);
  eo.max_running = opt.parallel;
  eo.kv_type = parse_kv_type(opt.kv_type, "--kv-type");
  eo.max_queue = max_queue;
  eo.threads = opt.threads;
  eo.sliding_window_kv = !opt.keep_sliding_kv;
  // Auto drafts with a model only when one is given (--draft); without it, prompt lookup or nothing.
  const bool with_draft = opt.spec == "draft" || (opt.spec == "auto" && !opt.draft.empty());
  if (with_draft) draft = load_draft(opt, model);
  eo.draft_model = draft.get();
  eo.measure_step_cost = opt.spec == "auto";
  eo.pipeline = pipeline.engine_options();
  return eo;
}

// The prompt's tokens: the text as given, or with --chat one user turn
// through the model's chat template (what serve's /v1/chat/completions gives
// an instruct model; given raw text, a small one often ignores the request).
std::vector<int32_t> encode_prompt(const RunOptions& opt, const Tokenizer& tokenizer, const std::string& text) {
  if (!opt.chat_template) return tokenizer.encode(text, tokenizer.add_bos());
  ChatTemplateInputs in;
  in.messages.push_back({{"role", "user"}, {"content", text}});
  set_special_tokens(in, tokenizer);
  return encode_rendered_prompt(tokenizer, in, opt.chat_template->apply(in));
}

GenerationRequest run_request(const RunOptions& opt, const Tokenizer& tokenizer, const std::string& prompt, uint64_t seed) {
  GenerationRequest r;
  r.prompt = encode_prompt(opt, tokenizer, prompt);
  r.sampling = opt.sampling;
  r.sampling.seed = seed;
  r.max_tokens = opt.n_predict;
  r.ignore_eos = opt.ignore_eos;
  r.speculation = {parse_speculative_mode(opt.spec), opt.draft_k, opt.adaptive_k};
  return r;
}

// -p through the engine (a pipelined run): the continuation streams as it comes.
void run_prompt_in_engine(const RunOptions& opt, const Model& model, const Tokenizer& tokenizer,
                          const PipelineSession& pipeline) {
  std::unique_ptr<Model> draft;
  Engine engine(model, tokenizer, run_engine_options(opt, model, 1, pipeline, draft));
  if (!opt.no_echo) std::fputs(opt.prompt.c_str(), stdout);
  std::promise<void> done;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  engine.submit(run_request(opt, tokenizer, opt.prompt, opt.sampling.seed), [&](const GenerationEvent& ev) {
    std::fputs(ev.text.c_str(), stdout);
    std::fflush(stdout);
    if (!ev.finished) return;
    error = ev.error;
    done.set_value();
  });
  done.get_future().wait();
  std::fputs("\n", stdout);
  if (!error.empty()) throw Error(error);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineMetrics m = engine.metrics();
  std::fprintf(stderr, "prompt: %lld tokens | generation: %lld tokens | %.2f s, %.2f tokens/s | forward steps: %lld\n",
               static_cast<long long>(m.prompt_tokens_total), static_cast<long long>(m.generated_tokens_total), seconds,
               static_cast<double>(m.generated_tokens_total) / std::max(seconds, 1e-9), static_cast<long long>(m.steps));
  print_speculation(opt, engine);
}

// Every prompt of the file through one Engine; outputs printed in file order.
void run_file(const RunOptions& opt, const Model& model, const Tokenizer& tokenizer, const PipelineSession& pipeline) {
  const std::vector<std::string> prompts = read_prompts(opt.prompts_file);
  std::unique_ptr<Model> draft;
  Engine engine(model, tokenizer, run_engine_options(opt, model, static_cast<int64_t>(prompts.size()), pipeline, draft));
  std::vector<std::string> outputs(prompts.size());
  std::vector<std::promise<void>> done(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r = run_request(opt, tokenizer, prompts[i], opt.sampling.seed + i);
    engine.submit(std::move(r), [&outputs, &errors, &done, i](const GenerationEvent& ev) {
      outputs[i] += ev.text;
      if (!ev.finished) return;
      errors[i] = ev.error;
      done[i].set_value();
    });
  }
  for (auto& d : done) d.get_future().wait();
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < prompts.size(); ++i)
    std::printf("### %zu\n%s%s\n\n", i + 1, opt.no_echo ? "" : prompts[i].c_str(), outputs[i].c_str());
  const EngineMetrics m = engine.metrics();
  std::fprintf(stderr, "%zu prompts, parallel %lld | prompt: %lld tokens | generation: %lld tokens | %.2f s, %.2f tokens/s"
               " | forward steps: %lld\n",
               prompts.size(), static_cast<long long>(opt.parallel), static_cast<long long>(m.prompt_tokens_total),
               static_cast<long long>(m.generated_tokens_total), seconds,
               static_cast<double>(m.generated_tokens_total) / std::max(seconds, 1e-9), static_cast<long long>(m.steps));
  print_speculation(opt, engine);
  std::fprintf(stderr, "KV pool peak: %lld of %lld blocks", static_cast<long long>(m.kv_blocks_used_peak),
               static_cast<long long>(m.kv_blocks_total));
  if (m.kv_sliding_blocks_total > 0)
    std::fprintf(stderr, " + sliding-window layers %lld of %lld", static_cast<long long>(m.kv_sliding_blocks_used_peak),
                 static_cast<long long>(m.kv_sliding_blocks_total));
  std::fprintf(stderr, " (%.2f MiB of K/V held at most)\n", static_cast<double>(m.kv_bytes_used_peak) / (1 << 20));
}

GenerateResult generate_plain(const RunOptions& opt, Decoder& decoder, Sampler& sampler, const Tokenizer& tokenizer,
                              std::span<const int32_t> prompt, const std::function<bool(int32_t)>& on_token) {
  GenerateOptions gen;
  gen.max_new_tokens = opt.n_predict;
  gen.stop_at_end_of_generation = !opt.ignore_eos;
  return generate(decoder, sampler, tokenizer, prompt, gen, on_token);
}

GenerateResult generate_with_spec(const RunOptions& opt, const Model& target, Decoder& decoder, Sampler& sampler,
                                  const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                  const std::function<bool(int32_t)>& on_token) {
  if (opt.decoder != "cached") throw Error("--spec needs --decoder cached (verification appends many tokens at once)");
  if (opt.spec == "auto")
    throw Error("--spec auto runs in the batching engine: give the prompts with -f FILE (or use kvserve serve)");
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<Drafter> drafter;
  if (opt.spec == "draft") {
    draft_model = load_draft(opt, target);
    drafter = std::make_unique<ModelDrafter>(*draft_model, decoder.max_context());
  } else {
    drafter = std::make_unique<NgramDrafter>();
  }
  SpeculativeOptions so;
  so.draft_k = opt.draft_k;
  so.adaptive_k = opt.adaptive_k;
  so.max_new_tokens = opt.n_predict;
  so.stop_at_end_of_generation = !opt.ignore_eos;
  const SpeculativeResult r = generate_speculative(decoder, *drafter, sampler, tokenizer, prompt, so, on_token);
  std::fprintf(stderr, "\nspeculative: %s%s, k %lld%s | target passes: %lld | drafts accepted: %lld of %lld (%.1f%%) | "
               "tokens per target pass: %.2f\n",
               drafter->name(), draft_model ? (" (" + draft_model->config().name + ")").c_str() : "",
               static_cast<long long>(opt.draft_k), opt.adaptive_k ? " (adaptive)" : "",
               static_cast<long long>(r.stats.target_passes), static_cast<long long>(r.stats.accepted),
               static_cast<long long>(r.stats.proposed), 100.0 * r.stats.acceptance_rate(), r.stats.tokens_per_pass());
  return r.generation;
}

void run_rank0(RunOptions opt, KVType kv_type, const PipelineSession& pipeline);

void run(RunOptions opt) {
  set_threads(opt.threads);
  if (opt.parallel <= 0) throw Error("--parallel must be positive, got " + std::to_string(opt.parallel));
  if (opt.n_predict < 0) throw Error("--n-predict must be >= 0, got " + std::to_string(opt.n_predict));
  opt.sampling.seed = opt.seed >= 0 ? static_cast<uint64_t>(opt.seed) : std::random_device{}();
  const Sampler probe(opt.sampling);  // validates the sampling flags before the model loads
  const KVType kv_type = parse_kv_type(opt.kv_type, "--kv-type");

  if (opt.pipeline.ranks > 1 && opt.decoder != "cached")
    throw Error("--pipeline-parallel runs in the batching engine: use --decoder cached");
  PipelineSession pipeline(opt.pipeline);
  pipeline.guard([&] {
    if (pipeline.rank() != 0) return pipeline.run_stage(opt.model, opt.rope.apply({}));
    run_rank0(opt, kv_type, pipeline);
  });
}

// The whole run, or rank 0's part of a pipelined one.
void run_rank0(RunOptions opt, KVType kv_type, const PipelineSession& pipeline) {
  auto t0 = std::chrono::steady_clock::now();
  auto model = Model::load(opt.model, pipeline.load_options(opt.rope.apply({})));
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  if (opt.chat) {
    std::string note;
    opt.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::for_model(model->file(), &note));
    if (!note.empty()) std::fprintf(stderr, "chat template: %s\n", note.c_str());
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (pipeline.active() || !opt.prompts_file.empty()) {
    if (opt.prompts_file.empty()) run_prompt_in_engine(opt, *model, tokenizer, pipeline);
    else run_file(opt, *model, tokenizer, pipeline);
    return pipeline.report(*model);
  }
  const std::vector<int32_t> prompt = encode_prompt(opt, tokenizer, opt.prompt);
  const int64_t context = std::min(opt.context, model->config().context_length);
  if (static_cast<int64_t>(prompt.size()) >= context)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context size of " +
                std::to_string(context) + " allows (raise --ctx-size)");
  auto decoder = make_decoder(opt.decoder, *model, context, kv_type);
  Sampler sampler(opt.sampling);

  if (!opt.no_echo) {
    std::fputs(opt.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  TokenTextStream stream(tokenizer);
  const auto print_token = [&](int32_t id) {
    const std::string text = stream.push(id);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return true;
  };
  const GenerateResult r = opt.spec == "none" ? generate_plain(opt, *decoder, sampler, tokenizer, prompt, print_token)
                                              : generate_with_spec(opt, *model, *decoder, sampler, tokenizer, prompt,
                                                                   print_token);
  std::fputs(stream.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);

  const auto n_gen = static_cast<double>(r.tokens.size());
  std::fprintf(stderr, "\nmodel: %s (%s, %lld layers) | decoder: %s | kv: %s | activations: %s | threads: %d | seed: %llu\n",
               model->config().name.c_str(), model->config().arch.c_str(),
               static_cast<long long>(model->config().n_layers), decoder->name(), kv_type_info(kv_type).name,
               activation_precision_name(activation_precision()), omp_get_max_threads(),
               static_cast<unsigned long long>(opt.sampling.seed));
  std::fprintf(stderr, "load: %.0f ms | prompt: %lld tokens, %.1f tokens/s | generation: %lld tokens, %.2f tokens/s\n",
               load_s * 1e3, static_cast<long long>(r.prompt_tokens),
               static_cast<double>(r.prompt_tokens) / std::max(r.prompt_seconds, 1e-9),
               static_cast<long long>(r.tokens.size()),
               n_gen > 1 ? (n_gen - 1) / std::max(r.generate_seconds, 1e-9) : 0.0);
}

}  // namespace

void register_run(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt");
  add_activations_flag(cmd);
  opt->rope.add_to(cmd);
  cmd->add_option("-m,--model", opt->model, "GGUF model file")->capture_default_str();
  cmd->add_option("-p,--prompt", opt->prompt, "Prompt text")->capture_default_str();
  cmd->add_option("-n,--n-predict", opt->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("-c,--ctx-size", opt->context, "Context size in tokens (capped at the model's)")->capture_default_str();
  cmd->add_option("-t,--threads", opt->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->add_option("--decoder", opt->decoder,
                  "naive (recompute everything each step), cached (KV cache + flash attention) or "
                  "cached-reference (KV cache, materializing attention)")
      ->check(CLI::IsMember({"naive", "cached", "cached-reference"}))
      ->capture_default_str();
  cmd->add_option("--kv-type", opt->kv_type,
                  "KV cache element type: f32, f16, bf16, q8_0, fp8, q4_0 (block types need head sizes that are "
                  "multiples of 32)")
      ->capture_default_str();
  cmd->add_option("--temp", opt->sampling.temperature, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", opt->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", opt->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", opt->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", opt->sampling.repetition_penalty, "Repetition penalty (1: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", opt->sampling.repeat_last_n, "Tokens the repetition penalty looks back")
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "Random seed (-1: random)")->capture_default_str();
  cmd->add_option("-f,--file", opt->prompts_file, "Prompts file, one prompt a line (runs them through the batching engine)");
  cmd->add_option("--parallel", opt->parallel, "With -f: sequences decoded together")->capture_default_str();
  cmd->add_option("--spec", opt->spec,
                  "Speculative decoding: none, draft (a draft model proposes), ngram (prompt lookup) or auto "
                  "(each step whichever is expected to pay, k up to --draft-k; the draft model only with --draft; "
                  "needs -f)")
      ->check(CLI::IsMember({"none", "draft", "ngram", "auto"}))
      ->capture_default_str();
  cmd->add_option("--draft", opt->draft,
                  "Draft model for --spec draft (default: the target's first --draft-layers layers)");
  cmd->add_option("--draft-k", opt->draft_k, "Tokens drafted per target pass")->capture_default_str();
  cmd->add_option("--draft-layers", opt->draft_layers,
                  "Layers of the target used as the draft when --draft is not given")
      ->capture_default_str();
  add_draft_flags(cmd, opt->draft_flags);
  cmd->add_flag("--adaptive-k", opt->adaptive_k,
                "Shrink the draft length when acceptance is low (--draft-k is the ceiling)");
  cmd->add_flag("--keep-sliding-kv", opt->keep_sliding_kv,
                "With -f: sliding-window layers (Gemma 3) keep every position instead of freeing what left the window");
  add_pipeline_flags(cmd, opt->pipeline);
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--no-echo", opt->no_echo, "Do not print the prompt before the continuation");
  cmd->add_flag("--chat", opt->chat,
                "Send each prompt as one user message through the model's chat template (as serve's "
                "/v1/chat/completions does) instead of as raw text");
  cmd->callback([opt] { run(*opt); });
}

}  // namespace kvserve::cli
