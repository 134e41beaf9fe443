#include "bench/engine_runner.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace kvserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Collects every request's timing from the engine thread; wait() blocks until
// `n` requests have finished.
class Tracker {
 public:
  Tracker(size_t n, Clock::time_point start) : timings_(n), start_(start) {}
  EventCallback callback(size_t i) {
    return [this, i](const GenerationEvent& ev) {
      const double now = std::chrono::duration<double>(Clock::now() - start_).count();
      std::lock_guard lock(mutex_);
      RequestTiming& t = timings_[i];
      if (!ev.tokens.empty()) t.add_delivery(now, static_cast<int64_t>(ev.tokens.size()));
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
  if (w.prompt_ids.empty()) throw Error("the in-process benchmark needs prompt token ids (a workload made with a tokenizer)");
  GenerationRequest r;
  r.prompt = w.prompt_ids;
  r.sampling.temperature = 0;
  r.max_tokens = w.output_tokens;
  r.ignore_eos = true;
  return r;
}

void sleep_until(Clock::time_point start, double s) { std::this_thread::sleep_until(start + std::chrono::duration<double>(s)); }

void submit(Engine& engine, Tracker& tracker, const std::vector<WorkItem>& items, size_t i) {
  tracker.set_arrival(i, items[i].arrival_s);
  if (!engine.submit(to_request(items[i]), tracker.callback(i))) throw Error("the engine refused a request");
}

// Submits each request at its arrival time; the engine batches them.
std::vector<RequestTiming> run_continuous(Engine& engine, const std::vector<WorkItem>& items) {
  const auto start = Clock::now();
  Tracker tracker(items.size(), start);
  for (size_t i = 0; i < items.size(); ++i) {
    sleep_until(start, items[i].arrival_s);
    submit(engine, tracker, items, i);
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
    for (size_t i = b; i < end; ++i) submit(engine, tracker, items, i);
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
  // Room for every running sequence at the longest (plus a cached prefix),
  // instead of the 1 GiB default that would dominate a short run.
  int64_t longest = 0;
  for (const WorkItem& w : items) longest = std::max(longest, w.prompt_tokens + w.output_tokens);
  if (pool.kv_memory_bytes > 0)
    eo.kv_memory_bytes = pool.kv_memory_bytes;
  else
    eo.kv_blocks = (concurrency + 1) * ((longest + eo.block_size - 1) / eo.block_size);
  return eo;
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kStatic: return "static";
    case Schedule::kContinuous: return "continuous";
    case Schedule::kContinuousPrefix: return "continuous + prefix";
  }
  return "?";
}

EngineRun run_engine(const Model& model, const Tokenizer& tokenizer, const std::vector<WorkItem>& items,
                     int concurrency, Schedule schedule, const EnginePool& pool) {
  if (concurrency <= 0) throw Error("--concurrency must be positive, got " + std::to_string(concurrency));
  Engine engine(model, tokenizer, engine_options(items, concurrency, schedule, pool));
  EngineRun run;
  const double cpu0 = cpu_seconds();
  run.timings = schedule == Schedule::kStatic ? run_static(engine, items, static_cast<size_t>(concurrency))
                                              : run_continuous(engine, items);
  run.cpu_s = cpu_seconds() - cpu0;
  engine.shutdown(true);  // returns once the counters include the last request (they lag its final event)
  run.metrics = engine.metrics();
  return run;
}

}  // namespace kvserve::bench
