// The ladder's measurements: the workload, the seven rungs and the counted
// work. Reporting (table, JSON, plot) is in ladder_report.cpp.
#include "ladder/ladder.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include <unistd.h>

#include "core/error.h"
#include "decode/decoder.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "kernels/dispatch.h"
#include "kv/paged_kv_storage.h"
#include "model/model.h"
#include "model/quantize_model.h"
#include "speculation/request_speculation.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Real English, so that greedy continuations are text and n-gram drafting
// has what a chat workload gives it; cycled to reach the requested lengths.
constexpr std::string_view kSharedText =
    "You are a helpful assistant who writes short, clear stories for children. Every story has a beginning, a "
    "middle and an end, uses simple words, and finishes with a small lesson about kindness or courage. Here is an "
    "example. Once upon a time, a little fox lived at the edge of a quiet forest. Each morning she walked to the "
    "river to watch the fish jump, and each evening she told the old owl what she had seen. ";
constexpr std::string_view kTopics[] = {
    "Write a story about a brave little boat that crossed a stormy lake to bring bread to a lonely island.",
    "Write a story about a girl named Lily who found a lost puppy in the park and helped it find its home.",
    "Write a story about a tiny robot who wanted to learn how to paint the colors of the sunset.",
    "Write a story about two friends who built a tree house and shared it with everyone in the village.",
    "Write a story about a sleepy bear who woke up in the middle of winter and went looking for honey.",
    "Write a story about a shy turtle who entered a race and learned that slow and steady is enough.",
    "Write a story about a dragon who was afraid of the dark and a mouse who carried a lantern for him.",
    "Write a story about a baker who made a giant cake for the whole town and forgot one small guest.",
};

// `tokens` repeated until it has exactly n.
std::vector<int32_t> cycled(const std::vector<int32_t>& tokens, int64_t n) {
  if (tokens.empty()) throw Error("the ladder workload text encodes to no tokens");
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  while (static_cast<int64_t>(out.size()) < n) out.push_back(tokens[out.size() % tokens.size()]);
  return out;
}

// Every prompt: the same `shared` tokens, then a request-specific part.
std::vector<std::vector<int32_t>> make_prompts(const Tokenizer& tokenizer, const LadderOptions& o, int64_t shared) {
  const std::vector<int32_t> prefix = cycled(tokenizer.encode(kSharedText, tokenizer.add_bos()), shared);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < o.requests; ++i) {
    const std::string text = " Request " + std::to_string(i + 1) + ". " +
                             std::string(kTopics[static_cast<size_t>(i) % std::size(kTopics)]) + " The story:";
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> own = cycled(tokenizer.encode(text, false), o.prompt_len - shared);
    prompt.insert(prompt.end(), own.begin(), own.end());
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

// Peak resident memory per rung: Linux resets VmHWM to the current RSS when
// "5" is written to clear_refs; without that, the peak is the process's so far.
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

// Sets the kernel path and thread count for a scope, restoring both after.
class KernelSetup {
 public:
  KernelSetup(Isa isa, int threads) : isa_(active_isa()), threads_(omp_get_max_threads()) {
    set_kernel_isa(isa);
    omp_set_num_threads(threads);
  }
  ~KernelSetup() {
    set_kernel_isa(isa_);
    omp_set_num_threads(threads_);
  }
  KernelSetup(const KernelSetup&) = delete;
  KernelSetup& operator=(const KernelSetup&) = delete;

 private:
  Isa isa_;
  int threads_;
};

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

// K/V bytes of one token in f32 across all layers (what every rung stores).
int64_t kv_bytes_per_token(const Model& model) {
  const ModelConfig& c = model.config();
  return 2 * c.n_layers * c.kv_dim() * static_cast<int64_t>(sizeof(float));
}

// One request of a sequential rung.
struct RequestRun {
  std::vector<int32_t> tokens;
  double prefill_s = 0, total_s = 0;
  int64_t rows = 0;
};

// Runs one request; `stop_early` (checked after each token) cuts it short.
using RequestRunner = std::function<RequestRun(std::span<const int32_t> prompt, const std::function<bool()>& stop_early)>;

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  int64_t gen_len = 0;
  double budget_s = 0;
};

// Median of the arrival-at-zero TTFTs of a sequential schedule: request i
// waits for the i before it. The first `complete` runs are timed; the rest
// (cut short or never run) use the mean duration and mean measured prefill.
double sequential_ttft_p50(const std::vector<RequestRun>& runs, size_t complete, int64_t requests,
                           double mean_duration) {
  double mean_prefill = 0;
  for (const RequestRun& r : runs) mean_prefill += r.prefill_s / static_cast<double>(runs.size());
  std::vector<double> ttft;
  double start = 0;
  for (size_t i = 0; i < static_cast<size_t>(requests); ++i) {
    const bool has_first_token = i < runs.size() && !runs[i].tokens.empty();
    ttft.push_back(start + (has_first_token ? runs[i].prefill_s : mean_prefill));
    start += i < complete ? runs[i].total_s : mean_duration;
  }
  std::sort(ttft.begin(), ttft.end());
  return ttft[ttft.size() / 2];
}

// Runs requests one at a time until the budget is spent. With
// rows_per_request > 0 a request may be cut mid-way (its steps all cost the
// same per row: the naive decoder) and the time is scaled by rows; otherwise
// only whole requests run and the time is scaled by requests.
void run_sequential(LadderRung& rung, const Workload& w, const RequestRunner& runner, int64_t rows_per_request) {
  const auto t0 = Clock::now();
  std::vector<RequestRun> runs;
  bool cut = false;
  for (const auto& prompt : w.prompts) {
    const auto stop_early = [&] { return rows_per_request > 0 && seconds_since(t0) > w.budget_s; };
    runs.push_back(runner(prompt, stop_early));
    cut = static_cast<int64_t>(runs.back().tokens.size()) < w.gen_len;
    if (cut || seconds_since(t0) > w.budget_s) break;
  }
  double measured_s = 0;
  for (const RequestRun& r : runs) {
    measured_s += r.total_s;
    rung.attention_rows += r.rows;
    rung.measured_tokens += static_cast<int64_t>(r.tokens.size());
    rung.outputs.push_back(r.tokens);
  }
  const auto requests = static_cast<int64_t>(w.prompts.size());
  rung.measured_requests = static_cast<int64_t>(runs.size());
  rung.output_tokens = requests * w.gen_len;
  rung.scaled = cut || rung.measured_requests < requests;
  rung.full_attention_rows = rows_per_request > 0 ? rows_per_request * requests
                                                  : rung.attention_rows * requests / rung.measured_requests;
  rung.seconds = measured_s * static_cast<double>(rung.full_attention_rows) / static_cast<double>(rung.attention_rows);
  rung.ttft_p50_s = sequential_ttft_p50(runs, runs.size() - (cut ? 1 : 0), requests, rung.seconds / static_cast<double>(requests));
}

RequestRunner decoder_runner(const std::string& kind, const Model& model, const Tokenizer& tokenizer, int64_t gen_len) {
  return [&, kind, gen_len](std::span<const int32_t> prompt, const std::function<bool()>& stop_early) {
    auto decoder = make_decoder(kind, model, static_cast<int64_t>(prompt.size()) + gen_len);
    Sampler sampler(greedy());
    GenerateOptions o;
    o.max_new_tokens = gen_len;
    o.stop_at_end_of_generation = false;
    const GenerateResult g =
        generate(*decoder, sampler, tokenizer, prompt, o, [&](int32_t) { return !stop_early(); });
    return RequestRun{g.tokens, g.prompt_seconds, g.prompt_seconds + g.generate_seconds, decoder->attention_rows()};
  };
}

// Collects the engine's streamed tokens and first-token times.
class EngineCollector {
 public:
  EngineCollector(size_t n, Clock::time_point start) : tokens_(n), first_token_s_(n, -1), start_(start) {}
  EventCallback callback(size_t i) {
    return [this, i](const GenerationEvent& ev) {
      std::lock_guard lock(mutex_);
      engine_threads_ = omp_get_max_threads();  // callbacks run on the engine's thread
      if (first_token_s_[i] < 0 && !ev.tokens.empty()) first_token_s_[i] = seconds_since(start_);
      tokens_[i].insert(tokens_[i].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        if (ev.finish_reason != "length") error_ = "request " + std::to_string(i) + " finished with " + ev.finish_reason + " " + ev.error;
        finished_++;
        done_.notify_all();
      }
    };
  }
  // Waits up to `timeout`; true when every request has finished.
  bool wait_all(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, timeout, [&] { return finished_ == tokens_.size(); });
  }
  std::vector<std::vector<int32_t>> tokens() { std::lock_guard lock(mutex_); return tokens_; }
  std::vector<double> first_token_s() { std::lock_guard lock(mutex_); return first_token_s_; }
  std::string error() { std::lock_guard lock(mutex_); return error_; }
  int engine_threads() { std::lock_guard lock(mutex_); return engine_threads_; }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<double> first_token_s_;
  size_t finished_ = 0;
  std::string error_;
  int engine_threads_ = 0;
  Clock::time_point start_;
};

// Every request submitted at t = 0 to one Engine; the K/V held is sampled
// while it runs (the engine reports blocks in use, not a peak). With
// `speculation` on, each request speculates so (rung 7: auto).
void run_engine(LadderRung& rung, const Model& model, const Tokenizer& tokenizer, const Workload& w, bool prefix_caching,
                const SpeculationSettings& speculation = {}) {
  EngineOptions eo;
  eo.measure_step_cost = speculation.mode == SpeculativeMode::kAuto;
  const auto n = static_cast<int64_t>(w.prompts.size());
  const int64_t longest = static_cast<int64_t>(w.prompts.front().size()) + w.gen_len;
  eo.max_running = eo.max_queue = n;
  eo.max_context = longest;
  eo.prefix_caching = prefix_caching;
  eo.kv_blocks = (n + 1) * ((longest + eo.block_size - 1) / eo.block_size);
  Engine engine(model, tokenizer, eo);
  const auto start = Clock::now();
  EngineCollector collector(w.prompts.size(), start);
  const auto submit = [&](size_t i) {
    GenerationRequest r;
    r.prompt = w.prompts[i];
    r.sampling = greedy();
    r.max_tokens = w.gen_len;
    r.ignore_eos = true;
    r.speculation = speculation;
    if (!engine.submit(std::move(r), collector.callback(i))) throw Error("the engine refused a ladder request");
  };
  // All at once: with prefix caching the scheduler holds back the prompts
  // that share the first one's prefix until its blocks are computed (a
  // step), so they find them in the cache.
  for (size_t i = 0; i < w.prompts.size(); ++i) submit(i);
  int64_t peak_blocks = 0;
  while (!collector.wait_all(std::chrono::milliseconds(2))) peak_blocks = std::max(peak_blocks, engine.metrics().kv_blocks_used);
  rung.seconds = seconds_since(start);
  if (!collector.error().empty()) throw Error("ladder engine rung: " + collector.error());
  const EngineMetrics m = engine.metrics();
  // Query rows the engine computed: prompt tokens not found in the prefix
  // cache, and every generated token but each request's last (never fed back).
  // (requests_finished may lag the last event, so count the requests instead.)
  // Drafts are computed rows too (accepted ones are the generated tokens they became).
  rung.attention_rows = rung.full_attention_rows =
      m.prompt_tokens_total + m.generated_tokens_total - n + m.spec_draft_tokens - m.spec_accepted_tokens;
  rung.kv_bytes = peak_blocks * PagedKVStorage::bytes_per_block(model.config().n_layers, eo.block_size, model.config().n_kv_heads,
                                                                model.config().head_dim, eo.kv_type, model.config().is_mla());
  rung.outputs = collector.tokens();
  rung.measured_requests = n;
  rung.output_tokens = rung.measured_tokens = n * w.gen_len;
  std::vector<double> ttft = collector.first_token_s();
  std::sort(ttft.begin(), ttft.end());
  rung.ttft_p50_s = ttft[ttft.size() / 2];
  rung.prefix_hit_tokens = m.prefix_hit_tokens;
  // The engine thread's OpenMP team follows OMP_NUM_THREADS, not this thread's setting.
  rung.threads = collector.engine_threads();
  if (prefix_caching)
    rung.note = std::to_string(m.prefix_hit_tokens) + " of " + std::to_string(m.prefix_query_tokens) +
                " prompt tokens found in the prefix cache (every request submitted at t = 0; the scheduler admits "
                "those sharing the first one's prefix a step later, once its blocks are computed)";
  if (speculation.mode != SpeculativeMode::kNone)
    rung.note += "; speculation (" + std::string(speculative_mode_name(speculation.mode)) + ", k <= " +
                 std::to_string(speculation.draft_k) + "): " + std::to_string(m.spec_rounds) + " verifications, " +
                 std::to_string(m.spec_accepted_tokens) + " of " + std::to_string(m.spec_draft_tokens) +
                 " drafts accepted";
}

// The decoders' own counters for a sequence grown one token at a time to N.
// Rows are per layer, so one layer of the model is enough to count them.
CountedWork count_work(const std::string& model_path, const std::vector<int32_t>& tokens, int64_t n) {
  auto one_layer = Model::load(model_path, ModelLoadOptions{.max_layers = 1});
  CountedWork w;
  w.n = std::min<int64_t>(n, static_cast<int64_t>(tokens.size()));
  for (const char* kind : {"naive", "cached"}) {
    auto decoder = make_decoder(kind, *one_layer, w.n);
    for (int64_t i = 0; i < w.n; ++i) decoder->append(std::span<const int32_t>(&tokens[static_cast<size_t>(i)], 1));
    (std::string_view(kind) == "naive" ? w.naive_rows : w.cached_rows) = decoder->attention_rows();
  }
  return w;
}

bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Temporary model copies, removed with the object.
class ModelCopies {
 public:
  explicit ModelCopies(const std::string& dir) : dir_(dir.empty() ? std::filesystem::temp_directory_path().string() : dir) {}
  ~ModelCopies() {
    for (const std::string& p : paths_) std::filesystem::remove(p);
  }
  ModelCopies(const ModelCopies&) = delete;
  ModelCopies& operator=(const ModelCopies&) = delete;
  std::string make(const std::string& source, DType type) {
    const std::string path = dir_ + "/kvserve_ladder_" + std::to_string(::getpid()) + "_" + dtype_name(type) + ".gguf";
    paths_.push_back(path);
    quantize_model(source, path, type);
    return path;
  }

 private:
  std::string dir_;
  std::vector<std::string> paths_;
};

struct ModelPlan {
  std::string f32_path, quantized_path, quantized_type;
};

// Without `with_f32` (--long-context), no f32 copy is made.
ModelPlan plan_models(const LadderOptions& o, LadderResult& result, ModelCopies& copies, bool with_f32) {
  const DType stored = Model::load(o.model_path)->weights().layers.at(0).wq.type;
  const std::string stored_name = dtype_name(stored);
  ModelPlan plan;
  if (!with_f32) {
    result.f32_weights_note = "no f32 copy (long context)";
  } else if (stored == DType::F32) {
    plan.f32_path = o.model_path;
    result.f32_weights_note = "the model's own f32 weights";
  } else {
    plan.f32_path = copies.make(o.model_path, DType::F32);
    result.f32_weights_note = "an f32 copy of the " + stored_name + " model (dequantized with `kvserve quantize`)";
  }
  if (is_float_type(stored)) {
    plan.quantized_path = copies.make(o.model_path, DType::Q8_0);
    plan.quantized_type = "q8_0";
    result.quantized_note = "a q8_0 copy of the " + stored_name + " model";
  } else {
    plan.quantized_path = o.model_path;
    plan.quantized_type = stored_name;
    result.quantized_note = "the model's own " + stored_name +
                            " weights (already quantized: rung 4 measures those, against rungs 1-3 on its f32 copy)";
  }
  return plan;
}

void validate(const LadderOptions& o) {
  if (o.requests < 1 || o.prompt_len < 2 || o.gen_len < 1)
    throw Error("ladder needs --requests >= 1, --prompt-len >= 2 and --gen-len >= 1");
  if (o.shared_prefix >= o.prompt_len) throw Error("--shared-prefix must be shorter than --prompt-len");
  if (o.draft_k < 1) throw Error("--draft-k must be >= 1");
  if (o.rung_budget_s < 0) throw Error("--rung-budget must be >= 0 seconds");
}

void say(const LadderOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

// Threads of the fast rungs (4-7, and --long-context's).
int fast_threads(const LadderOptions& o) { return o.threads > 0 ? o.threads : omp_get_num_procs(); }

LadderRung start_rung(int number, const std::string& name, const std::string& weights, Isa isa, int threads) {
  LadderRung r;
  r.number = number;
  r.name = name;
  r.weights = weights;
  r.isa = isa_name(isa);
  r.threads = threads;
  reset_peak_rss();
  return r;
}

void finish_rung(const LadderOptions& o, LadderResult& result, LadderRung rung) {
  if (rung.peak_rss_bytes == 0) rung.peak_rss_bytes = peak_rss_bytes();
  say(o, "rung " + std::to_string(rung.number) + " (" + rung.name + "): " + std::to_string(rung.tokens_per_s()) +
             " tokens/s" + (rung.scaled ? " (scaled)" : ""));
  result.rungs.push_back(std::move(rung));
}

// Rungs 1-3: f32 weights, scalar kernels, one thread, one request at a time.
void run_f32_rungs(const LadderOptions& o, LadderResult& result, const std::string& path, const Tokenizer& tokenizer,
                   const Workload& w) {
  auto model = Model::load(path);
  const KernelSetup scalar(Isa::Scalar, 1);
  const auto p = static_cast<int64_t>(w.prompts.front().size());
  const int64_t per_token = kv_bytes_per_token(*model);
  const struct {
    const char* kind;
    const char* name;
  } rungs[] = {{"naive", "naive (full recompute)"}, {"cached-reference", "+ KV cache"}, {"cached", "+ flash attention"}};
  for (size_t i = 0; i < std::size(rungs); ++i) {
    LadderRung rung = start_rung(static_cast<int>(i) + 1, rungs[i].name, "f32", Isa::Scalar, 1);
    const bool naive = i == 0;
    say(o, "rung " + std::to_string(rung.number) + ": " + rung.name);
    run_sequential(rung, w, decoder_runner(rungs[i].kind, *model, tokenizer, w.gen_len),
                   naive ? naive_rows_per_request(p, w.gen_len) : 0);
    // The naive decoder allocates a scratch cache for the whole sequence every step.
    rung.kv_bytes = per_token * (naive ? p + w.gen_len - 1 : p + w.gen_len);
    finish_rung(o, result, std::move(rung));
  }
}

// Rungs 5-7, each run o.rounds times in turn and kept at its fastest run.
// Rung 7 is the whole engine of rung 6 plus speculation that drafts only when
// the measured step cost and each request's acceptance say it pays.
void run_engine_rungs(const LadderOptions& o, LadderResult& result, const Model& model, const std::string& type,
                      const Tokenizer& tokenizer, const Workload& w, int threads) {
  struct EngineRung {
    int number;
    const char* name;
    bool prefix_caching;
    SpeculationSettings speculation;
  };
  const EngineRung rungs[] = {{5, "+ paged KV, continuous batching", false, {}},
                              {6, "+ prefix caching", true, {}},
                              {7, "+ speculative decoding (auto)", true, {SpeculativeMode::kAuto, o.draft_k, false}}};
  const int rounds = std::max(o.rounds, 1);
  std::vector<std::optional<LadderRung>> fastest(std::size(rungs));
  std::vector<std::vector<double>> speeds(std::size(rungs));
  for (int round = 0; round < rounds; ++round)
    for (size_t j = 0; j < std::size(rungs); ++j) {
      const size_t i = round % 2 == 0 ? j : std::size(rungs) - 1 - j;
      LadderRung rung = start_rung(rungs[i].number, rungs[i].name, type, best_isa(), threads);
      say(o, "rung " + std::to_string(rung.number) + ": " + rung.name +
                 (rounds > 1 ? " (round " + std::to_string(round + 1) + " of " + std::to_string(rounds) + ")" : ""));
      run_engine(rung, model, tokenizer, w, rungs[i].prefix_caching, rungs[i].speculation);
      rung.peak_rss_bytes = peak_rss_bytes();
      speeds[i].push_back(rung.tokens_per_s());
      if (!fastest[i] || rung.seconds < fastest[i]->seconds) fastest[i] = std::move(rung);
    }
  for (size_t i = 0; i < std::size(rungs); ++i) {
    LadderRung& rung = *fastest[i];
    if (rounds > 1) {
      const auto [lo, hi] = std::minmax_element(speeds[i].begin(), speeds[i].end());
      char range[96];
      std::snprintf(range, sizeof(range), "fastest of %d runs (%.0f-%.0f tokens/s)", rounds, *lo, *hi);
      rung.note = rung.note.empty() ? range : std::string(range) + "; " + rung.note;
    }
    finish_rung(o, result, std::move(rung));
  }
}

// Rungs 4-7: quantized weights, the best kernels, every thread.
void run_quantized_rungs(const LadderOptions& o, LadderResult& result, const ModelPlan& plan,
                         const Tokenizer& tokenizer, const Workload& w) {
  auto model = Model::load(plan.quantized_path);
  const int threads = fast_threads(o);
  const KernelSetup fast(best_isa(), threads);
  const auto p = static_cast<int64_t>(w.prompts.front().size());
  const Workload unlimited{w.prompts, w.gen_len, 1e30};  // fast rungs always run every request
  LadderRung quantized = start_rung(4, "+ quantized weights, SIMD, threads", plan.quantized_type, best_isa(), threads);
  say(o, "rung 4: " + quantized.name);
  run_sequential(quantized, unlimited, decoder_runner("cached", *model, tokenizer, w.gen_len), 0);
  quantized.kv_bytes = kv_bytes_per_token(*model) * (p + w.gen_len);
  finish_rung(o, result, std::move(quantized));
  run_engine_rungs(o, result, *model, plan.quantized_type, tokenizer, w, threads);
}

// --long-context: rung 2 (materializing attention) and rung 3 (flash
// attention) with rung 4's quantized weights, best kernels and threads, one
// request at a time as in the f32 rungs.
void run_attention_rungs(const LadderOptions& o, LadderResult& result, const ModelPlan& plan,
                         const Tokenizer& tokenizer, const Workload& w) {
  auto model = Model::load(plan.quantized_path);
  const int threads = fast_threads(o);
  const KernelSetup fast(best_isa(), threads);
  const auto p = static_cast<int64_t>(w.prompts.front().size());
  const struct {
    int number;
    const char* kind;
    const char* name;
  } rungs[] = {{2, "cached-reference", "KV cache, materializing attention"}, {3, "cached", "+ flash attention"}};
  for (const auto& r : rungs) {
    LadderRung rung = start_rung(r.number, r.name, plan.quantized_type, best_isa(), threads);
    say(o, "rung " + std::to_string(r.number) + " (long context): " + rung.name);
    run_sequential(rung, w, decoder_runner(r.kind, *model, tokenizer, w.gen_len), 0);
    rung.kv_bytes = kv_bytes_per_token(*model) * (p + w.gen_len);
    finish_rung(o, result, std::move(rung));
  }
  const LadderRung& reference = result.rungs.at(0);
  for (LadderRung& r : result.rungs) {
    r.reference = "rung 2";
    r.agreement = token_agreement(r.outputs, reference.outputs);
  }
}

// Greedy text checks: rungs 1-3 against rung 2 (f32, every request), 4-7
// against rung 4 (same quantized weights); rung 4 itself against rung 2.
void compare_outputs(LadderResult& result) {
  const auto& f32_reference = result.rungs.at(1).outputs;
  const auto& quantized_reference = result.rungs.at(3).outputs;
  for (LadderRung& r : result.rungs) {
    const bool f32 = r.number <= 3;
    r.reference = f32 ? "rung 2" : "rung 4";
    r.agreement = token_agreement(r.outputs, f32 ? f32_reference : quantized_reference);
  }
  result.f32_quantized_agreement = token_agreement(quantized_reference, f32_reference);
}

}  // namespace

int64_t naive_rows_per_request(int64_t prompt_len, int64_t gen_len) {
  int64_t rows = prompt_len;  // the prefill step
  for (int64_t i = 1; i < gen_len; ++i) rows += prompt_len + i;
  return rows;
}

double token_agreement(const std::vector<std::vector<int32_t>>& outputs,
                       const std::vector<std::vector<int32_t>>& reference) {
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < outputs.size() && i < reference.size(); ++i) {
    const auto& a = outputs[i];
    const auto& b = reference[i];
    const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
    same += mismatch.first - a.begin();
    total += static_cast<int64_t>(a.size());
  }
  return total ? static_cast<double>(same) / static_cast<double>(total) : 1.0;
}

LadderResult run_ladder(const LadderOptions& o) {
  validate(o);
  LadderResult result;
  result.model_path = o.model_path;
  result.requests = o.requests;
  result.prompt_len = o.prompt_len;
  result.gen_len = o.gen_len;
  result.shared_prefix = o.shared_prefix >= 0 ? o.shared_prefix : o.prompt_len / 2;
  std::optional<Tokenizer> tokenizer;
  {
    auto model = Model::load(o.model_path);
    result.model_name = model->config().name;
    if (o.prompt_len + o.gen_len + o.draft_k + 1 > model->config().context_length)
      throw Error("prompt + generated tokens exceed the model's context of " +
                  std::to_string(model->config().context_length));
    tokenizer.emplace(Tokenizer::from_gguf(model->file()));
  }
  const Workload w{make_prompts(*tokenizer, o, result.shared_prefix), o.gen_len, o.rung_budget_s};
  ModelCopies copies(o.temp_dir);
  say(o, "preparing model copies");
  const ModelPlan plan = plan_models(o, result, copies, !o.long_context);
  if (o.long_context) {
    result.long_context = true;
    run_attention_rungs(o, result, plan, *tokenizer, w);
    return result;
  }
  run_f32_rungs(o, result, plan.f32_path, *tokenizer, w);
  run_quantized_rungs(o, result, plan, *tokenizer, w);
  compare_outputs(result);
  {
    const KernelSetup fast(best_isa(), fast_threads(o));
    result.counted = count_work(plan.quantized_path, cycled(w.prompts.front(), 100), 100);
  }
  return result;
}

}  // namespace kvserve
