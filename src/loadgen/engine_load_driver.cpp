#include "loadgen/engine_load_driver.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace kvserve::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// Collects every request's timing from the engine thread; wait() blocks until
// `n` requests have finished.
class Tracker {
 public:
  Tracker(size_t n, Clock::time_point start) : timings_(n), delivered_(n, 0), start_(start) {}
  // Request i's events. Only its first `useful` tokens are its output (a
  // padded static batch generates more and throws them away): they are timed
  // and counted, and the request's own finish is its last useful token.
  EventCallback callback(size_t i, int64_t useful) {
    return [this, i, useful](const GenerationEvent& ev) {
      const double now = std::chrono::duration<double>(Clock::now() - start_).count();
      std::lock_guard lock(mutex_);
      RequestTiming& t = timings_[i];
      const int64_t kept = std::min<int64_t>(static_cast<int64_t>(ev.tokens.size()), useful - delivered_[i]);
      if (kept > 0) {
        t.add_delivery(now, kept);
        delivered_[i] += kept;
        if (delivered_[i] == useful) t.finish_s = now;
      }
      if (ev.finished) {
        if (t.finish_s == 0) t.finish_s = now;
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
  std::vector<int64_t> delivered_;  // useful tokens seen per request
  size_t finished_ = 0;
  Clock::time_point start_;
};

// `generate` tokens, at least the item's own output_tokens.
GenerationRequest to_request(const WorkItem& w, int64_t generate, const EnginePool& pool) {
  if (w.prompt_ids.empty()) throw Error("the in-process benchmark needs prompt token ids (a workload made with a tokenizer)");
  GenerationRequest r;
  r.prompt = w.prompt_ids;
  r.sampling.temperature = 0;
  r.max_tokens = std::max(generate, w.output_tokens);
  r.ignore_eos = true;
  if (pool.compiler && pool.constraint) r.constraint = pool.compiler->compile(*pool.constraint);
  return r;
}

void sleep_until(Clock::time_point start, double s) { std::this_thread::sleep_until(start + std::chrono::duration<double>(s)); }

void submit(Engine& engine, Tracker& tracker, const std::vector<WorkItem>& items, size_t i, const EnginePool& pool,
            int64_t generate = 0) {
  tracker.set_arrival(i, items[i].arrival_s);
  if (!engine.submit(to_request(items[i], generate, pool), tracker.callback(i, items[i].output_tokens)))
    throw Error("the engine refused a request");
}

// Submits each request at its arrival time; the engine batches them.
std::vector<RequestTiming> run_continuous(Engine& engine, const std::vector<WorkItem>& items, const EnginePool& pool) {
  const auto start = Clock::now();
  Tracker tracker(items.size(), start);
  for (size_t i = 0; i < items.size(); ++i) {
    sleep_until(start, items[i].arrival_s);
    submit(engine, tracker, items, i, pool);
  }
  tracker.wait(items.size());
  return tracker.timings();
}

// Batches of `concurrency` in arrival order; a batch starts once all of its
// requests have arrived and the previous batch has completely finished.
// Padded (the classic static batch, as a fixed [batch, length] tensor): every
// sequence of the batch is computed until the longest is done, a finished
// one's extra tokens thrown away. Early exit: a finished sequence leaves the
// batch, which then runs smaller until its slowest is done.
std::vector<RequestTiming> run_static(Engine& engine, const std::vector<WorkItem>& items, size_t concurrency,
                                      bool padded, const EnginePool& pool) {
  const auto start = Clock::now();
  Tracker tracker(items.size(), start);
  for (size_t b = 0; b < items.size(); b += concurrency) {
    const size_t end = std::min(items.size(), b + concurrency);
    int64_t longest = 0;
    for (size_t i = b; i < end; ++i) longest = std::max(longest, items[i].output_tokens);
    sleep_until(start, items[end - 1].arrival_s);
    for (size_t i = b; i < end; ++i) submit(engine, tracker, items, i, pool, padded ? longest : 0);
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

}  // namespace

EngineOptions engine_options(const std::vector<WorkItem>& items, int concurrency, Schedule schedule, const EnginePool& pool) {
  EngineOptions eo;
  eo.kv_type = pool.kv_type;
  eo.max_running = concurrency;
  eo.max_queue = static_cast<int64_t>(items.size());
  eo.prefix_caching = schedule == Schedule::kContinuousPrefix;
  // Room for every running sequence at the longest (plus a cached prefix;
  // padded static sequences grow to the longest prompt + the longest output),
  // instead of the 1 GiB default that would dominate a short run.
  int64_t longest = 0;
  int64_t longest_output = 0;
  for (const WorkItem& w : items) {
    longest = std::max(longest, w.prompt_tokens);
    longest_output = std::max(longest_output, w.output_tokens);
  }
  longest += longest_output;
  if (pool.kv_memory_bytes > 0)
    eo.kv_memory_bytes = pool.kv_memory_bytes;
  else
    eo.kv_blocks = (concurrency + 1) * ((longest + eo.block_size - 1) / eo.block_size);
  eo.pipeline = pool.pipeline;
  return eo;
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kStatic: return "static (padded)";
    case Schedule::kStaticEarlyExit: return "static, early exit";
    case Schedule::kContinuous: return "continuous";
    case Schedule::kContinuousPrefix: return "continuous + prefix";
  }
  return "?";
}

EngineLoadRun run_engine_load(const Model& model, const Tokenizer& tokenizer, const std::vector<WorkItem>& items,
                              int concurrency, Schedule schedule, const EnginePool& pool) {
  if (concurrency <= 0) throw Error("--concurrency must be positive, got " + std::to_string(concurrency));
  Engine engine(model, tokenizer, engine_options(items, concurrency, schedule, pool));
  EngineLoadRun run;
  const double cpu0 = cpu_seconds();
  const auto batch = static_cast<size_t>(concurrency);
  run.timings = schedule == Schedule::kStatic          ? run_static(engine, items, batch, true, pool)
                : schedule == Schedule::kStaticEarlyExit ? run_static(engine, items, batch, false, pool)
                                                         : run_continuous(engine, items, pool);
  run.cpu_s = cpu_seconds() - cpu0;
  engine.shutdown(true);  // returns once the counters include the last request (they lag its final event)
  run.metrics = engine.metrics();
  return run;
}

}  // namespace kvserve::loadgen
