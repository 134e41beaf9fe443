// `kvserve bench --serving`: a synthetic chat workload replayed against the
// in-process Engine, in the manner of vLLM's benchmark_serving. Requests
// arrive as a Poisson process (or all at once), with prompt and output
// lengths drawn log-uniformly over a wide range (-p and -n are the maxima,
// the minima a sixteenth of them) and an optional shared system prompt.
// Three schedules run the same workload:
//   static      batches of --concurrency requests, each batch waits for its slowest
//   continuous  requests join and leave the running batch every step
//   +prefix     continuous, with the shared prompt's blocks reused
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "apps/bench.h"
#include "core/error.h"
#include "engine/engine.h"
#include "kv/paged_kv_storage.h"

namespace kvserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct WorkItem {
  double arrival_s = 0;           // since the start of the run
  std::vector<int32_t> prompt;
  int64_t output_tokens = 0;
};

struct RequestTiming {
  double arrival_s = 0, first_token_s = -1, finish_s = 0;
  int64_t output_tokens = 0;
};

int64_t log_uniform(std::mt19937_64& rng, int64_t max) {
  const double lo = std::log(std::max<double>(1.0, static_cast<double>(max) / 16.0));
  const double hi = std::log(static_cast<double>(std::max<int64_t>(max, 1)));
  return std::max<int64_t>(1, static_cast<int64_t>(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng))));
}

std::vector<WorkItem> make_workload(const BenchOptions& o, int64_t vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> system_prompt(static_cast<size_t>(o.shared_prefix));
  for (int32_t& t : system_prompt) t = token(rng);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  std::vector<WorkItem> items;
  double t = 0;
  for (int i = 0; i < o.requests; ++i) {
    WorkItem w;
    if (o.request_rate > 0) t += gap(rng);
    w.arrival_s = t;
    w.prompt = system_prompt;
    const int64_t n = log_uniform(rng, o.n_prompt.front());
    for (int64_t j = 0; j < n; ++j) w.prompt.push_back(token(rng));
    w.output_tokens = log_uniform(rng, o.n_gen.front());
    items.push_back(std::move(w));
  }
  return items;
}

// Collects every request's timing; wait() blocks until `n` have finished.
class Tracker {
 public:
  explicit Tracker(size_t n, Clock::time_point start) : timings_(n), start_(start) {}
  EventCallback callback(size_t i) {
    return [this, i](const GenerationEvent& ev) {
      const double now = std::chrono::duration<double>(Clock::now() - start_).count();
      std::lock_guard lock(mutex_);
      RequestTiming& t = timings_[i];
      if (t.first_token_s < 0 && !ev.tokens.empty()) t.first_token_s = now;
      t.output_tokens = ev.completion_tokens;
      if (ev.finished) {
        t.finish_s = now;
        finished_++;
        done_.notify_all();
      }
    };
  }
  void set_arrival(size_t i, double s) {
    std::lock_guard lock(mutex_);
    timings_[i].arrival_s = s;
  }
  void wait(size_t n) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return finished_ >= n; });
  }
  std::vector<RequestTiming> timings() {
    std::lock_guard lock(mutex_);
    return timings_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<RequestTiming> timings_;
  size_t finished_ = 0;
  Clock::time_point start_;
};

GenerationRequest to_request(const WorkItem& w) {
  GenerationRequest r;
  r.prompt = w.prompt;
  r.sampling.temperature = 0;
  r.max_tokens = w.output_tokens;
  r.ignore_eos = true;
  return r;
}

void sleep_until(Clock::time_point start, double s) { std::this_thread::sleep_until(start + std::chrono::duration<double>(s)); }

// Submits each request at its arrival time; the engine batches them.
std::vector<RequestTiming> run_continuous(Engine& engine, const std::vector<WorkItem>& items) {
  const auto start = Clock::now();
  Tracker tracker(items.size(), start);
  for (size_t i = 0; i < items.size(); ++i) {
    sleep_until(start, items[i].arrival_s);
    tracker.set_arrival(i, items[i].arrival_s);
    if (!engine.submit(to_request(items[i]), tracker.callback(i))) throw Error("the engine refused a request");
  }
  tracker.wait(items.size());
  return tracker.timings();
}

// Batches of `concurrency` in arrival order; a batch starts once all of its
// requests have arrived and the previous batch has completely finished.
std::vector<RequestTiming> run_static(Engine& engine, const std::vector<WorkItem>& items, size_t concurrency) {
  const auto start = Clock::now();
  Tracker tracker(items.size(), start);
  for (size_t b = 0; b < items.size(); b += concurrency) {
    const size_t end = std::min(items.size(), b + concurrency);
    sleep_until(start, items[end - 1].arrival_s);
    for (size_t i = b; i < end; ++i) {
      tracker.set_arrival(i, items[i].arrival_s);
      if (!engine.submit(to_request(items[i]), tracker.callback(i))) throw Error("the engine refused a request");
    }
    tracker.wait(end);
  }
  return tracker.timings();
}

// CPU seconds this process has used (all threads): on a shared machine a
// steadier measure of the work a schedule needs than wall time.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
};

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  s.p50 = at(0.50);
  s.p99 = at(0.99);
  return s;
}

void print_row(const char* name, const std::vector<RequestTiming>& timings, const EngineMetrics& m, double cpu_s) {
  double end = 0;
  int64_t out_tokens = 0;
  std::vector<double> ttft, tpot;
  for (const RequestTiming& t : timings) {
    end = std::max(end, t.finish_s);
    out_tokens += t.output_tokens;
    ttft.push_back((t.first_token_s - t.arrival_s) * 1e3);
    if (t.output_tokens > 1) tpot.push_back((t.finish_s - t.first_token_s) * 1e3 / static_cast<double>(t.output_tokens - 1));
  }
  const Stats a = stats_of(ttft), b = stats_of(tpot);
  std::printf("| %-19s | %7.2f | %9.1f | %7.1f | %7.0f / %7.0f / %7.0f | %6.1f / %6.1f / %6.1f | %5lld | %6lld | %4lld |\n",
              name, static_cast<double>(timings.size()) / end, static_cast<double>(out_tokens) / end,
              static_cast<double>(out_tokens) / cpu_s, a.mean, a.p50, a.p99,
              b.mean, b.p50, b.p99, static_cast<long long>(m.prefix_hit_tokens), static_cast<long long>(m.steps),
              static_cast<long long>(m.preemptions));
  std::fflush(stdout);
}

int64_t longest_sequence(const BenchOptions& o) { return o.shared_prefix + o.n_prompt.front() + o.n_gen.front(); }

EngineOptions engine_options(const BenchOptions& o, const std::string& mode) {
  EngineOptions eo;
  eo.max_running = o.concurrency;
  eo.max_queue = o.requests;
  eo.prefix_caching = mode == "continuous + prefix";
  eo.kv_type = parse_kv_type(o.kv_type, "--kv-type");
  if (o.kv_mem_mib > 0) {
    eo.kv_memory_bytes = o.kv_mem_mib << 20;
  } else {
    // Room for every running sequence at its longest (plus the cached prefix),
    // instead of the 1 GiB default that would dominate a short run.
    eo.kv_blocks = (o.concurrency + 1) * ((longest_sequence(o) + eo.block_size - 1) / eo.block_size);
  }
  return eo;
}

// The pool the engine will allocate: bytes per token in the KV type, blocks,
// and how many sequences of the longest possible length fit at once.
void print_kv_pool(const BenchOptions& o, const ModelConfig& c) {
  const EngineOptions eo = engine_options(o, "continuous");
  const int64_t per_block = PagedKVStorage::bytes_per_block(c.n_layers, eo.block_size, c.n_kv_heads, c.head_dim, eo.kv_type);
  const int64_t blocks = eo.kv_blocks > 0 ? eo.kv_blocks : eo.kv_memory_bytes / per_block;
  const int64_t blocks_per_seq = (longest_sequence(o) + eo.block_size - 1) / eo.block_size;
  std::printf("KV %s: %lld bytes/token | pool %lld blocks x %lld tokens = %.1f MiB | fits %lld sequences of %lld tokens\n\n",
              o.kv_type.c_str(), static_cast<long long>(per_block / eo.block_size), static_cast<long long>(blocks),
              static_cast<long long>(eo.block_size), static_cast<double>(blocks * per_block) / (1 << 20),
              static_cast<long long>(blocks / blocks_per_seq), static_cast<long long>(longest_sequence(o)));
}

}  // namespace

int run_serving_bench(const BenchOptions& o) {
  if (!o.url.empty()) throw Error("--url (a remote server) is not supported yet; drop it to bench the in-process engine");
  if (o.requests <= 0 || o.concurrency <= 0) throw Error("--requests and --concurrency must be positive");
  if (o.shared_prefix < 0) throw Error("--shared-prefix must be >= 0");
  if (o.threads.front() > 0) omp_set_num_threads(o.threads.front());
  auto model = Model::load(o.models.front());
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  const std::vector<WorkItem> items = make_workload(o, model->config().vocab_size);
  int64_t prompt_total = 0, output_total = 0;
  for (const WorkItem& w : items) {
    prompt_total += static_cast<int64_t>(w.prompt.size());
    output_total += w.output_tokens;
  }
  std::printf("model %s | %d requests, rate %s/s, concurrency %d | prompt tokens %lld (shared prefix %lld), output %lld | "
              "threads %d\n",
              model->config().name.c_str(), o.requests, o.request_rate > 0 ? std::to_string(o.request_rate).c_str() : "inf",
              o.concurrency, static_cast<long long>(prompt_total), static_cast<long long>(o.shared_prefix),
              static_cast<long long>(output_total), omp_get_max_threads());
  print_kv_pool(o, model->config());
  std::printf("| schedule            |  req/s  | out tok/s | tok/CPUs| TTFT ms mean / p50 / p99  | TPOT ms mean / p50 / p99 | hit tk| steps  | pre  |\n");
  std::printf("|---------------------|---------|-----------|---------|---------------------------|--------------------------|-------|--------|------|\n");
  for (const char* mode : {"static", "continuous", "continuous + prefix"}) {
    const EngineOptions eo = engine_options(o, mode);
    Engine engine(*model, tokenizer, eo);
    const double cpu0 = cpu_seconds();
    const auto timings = std::string(mode) == "static" ? run_static(engine, items, static_cast<size_t>(o.concurrency))
                                                       : run_continuous(engine, items);
    print_row(mode, timings, engine.metrics(), cpu_seconds() - cpu0);
  }
  return 0;
}

}  // namespace kvserve::cli
