#include "loadgen/http_load_driver.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"

namespace kvserve::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// The shared state of the client threads: the next item to send, the results,
// and the first failure, which stops every thread.
class RemoteRunState {
 public:
  explicit RemoteRunState(const std::vector<WorkItem>& items) : items_(items), results_(items.size()) {}

  // The index of the next item to send, or nullopt when all are taken or the run failed.
  std::optional<size_t> take() {
    const size_t i = next_++;
    return i < items_.size() && !failed_ ? std::optional<size_t>(i) : std::nullopt;
  }
  // Sleeps until `at` (since start); false when the run failed meanwhile.
  bool wait_until(Clock::time_point at) {
    std::unique_lock lock(mutex_);
    return !failed_changed_.wait_until(lock, at, [this] { return failed_.load(); });
  }
  void fail(const std::string& message) {
    std::lock_guard lock(mutex_);
    if (!failed_) first_error_ = message;
    failed_ = true;
    failed_changed_.notify_all();
  }
  const std::atomic<bool>& failed() const { return failed_; }
  const std::string& first_error() const { return first_error_; }
  const std::vector<WorkItem>& items() const { return items_; }
  std::vector<CompletionResult>& results() { return results_; }  // each slot written by one thread

 private:
  const std::vector<WorkItem>& items_;
  std::vector<CompletionResult> results_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::condition_variable failed_changed_;
  std::string first_error_;
};

void client_thread(const HttpUrl& url, const HttpLoadOptions& o, const std::string& model, Clock::time_point start,
                   RemoteRunState& state) {
  try {
    OpenAiClient client(url, o.client);
    while (const std::optional<size_t> i = state.take()) {
      const WorkItem& item = state.items()[*i];
      if (!state.wait_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(item.arrival_s))))
        return;
      CompletionResult r = client.stream_completion(model, item, start, state.failed());
      r.timing.arrival_s = item.arrival_s;
      state.results()[*i] = std::move(r);
    }
  } catch (const std::exception& e) {
    state.fail(e.what());
  }
}

}  // namespace

HttpLoadRun run_http_load(const HttpLoadOptions& o, const std::vector<WorkItem>& items) {
  if (o.concurrency <= 0) throw Error("--concurrency must be positive, got " + std::to_string(o.concurrency));
  const HttpUrl url = parse_http_url(o.url);
  HttpLoadRun run;
  run.model = o.model.empty() ? OpenAiClient(url, o.client).first_model_id() : o.model;
  RemoteRunState state(items);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  const size_t n_threads = std::min(items.size(), static_cast<size_t>(o.concurrency));
  for (size_t t = 0; t < n_threads; ++t)
    threads.emplace_back([&] { client_thread(url, o, run.model, start, state); });
  for (std::thread& t : threads) t.join();
  if (state.failed()) throw Error(state.first_error());
  for (CompletionResult& r : state.results()) {
    if (r.prompt_tokens >= 0) {
      run.reported_prompt_tokens += r.prompt_tokens;
      run.requests_with_usage++;
    }
    run.timings.push_back(std::move(r.timing));
  }
  return run;
}

}  // namespace kvserve::loadgen
