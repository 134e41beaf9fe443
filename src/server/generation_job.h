#pragma once
// One HTTP request's engine requests (one per prompt, each with n sequences:
// the choices) and the events they send back. Engine callbacks only queue events; the HTTP thread takes them
// with next(), so a slow client never holds up the engine thread.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "engine/engine.h"
#include "engine/request_validation.h"
#include "server/server_metrics.h"

namespace kvserve::server {

using Clock = std::chrono::steady_clock;

struct ChoiceEvent {
  size_t choice = 0;
  GenerationEvent event;
  Clock::time_point at{};  // when the engine sent it (the HTTP thread may take it later)
};

class GenerationJob;

// The jobs in flight, so that shutdown can wait for them or cancel them.
class JobRegistry {
 public:
  void add(GenerationJob* job);
  void remove(GenerationJob* job);
  void cancel_all();
  // True when no job is left before the timeout.
  bool wait_until_empty(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable emptied_;
  std::set<GenerationJob*> jobs_;
};

class GenerationJob {
 public:
  // Submits every request. Throws ApiError 429 when the engine's queue is
  // full (the requests already submitted are cancelled first).
  // hold: kept until the job is destroyed (the model's lease: its engine stays loaded while the job uses it).
  GenerationJob(Engine& engine, ServerMetrics& metrics, JobRegistry& registry, std::vector<ValidatedRequest> requests,
                Clock::time_point arrival, std::shared_ptr<const void> hold = nullptr);
  ~GenerationJob();  // cancels whatever has not finished, freeing its KV blocks
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  // The next event of any choice, or nullopt when none came within timeout.
  std::optional<ChoiceEvent> next(std::chrono::milliseconds timeout);
  // Every choice's final event has been returned by next().
  bool done() const { return finals_taken_ == n_choices_; }
  void cancel();
  size_t choices() const { return n_choices_; }

 private:
  struct Shared;
  void submit_all(std::vector<ValidatedRequest> requests);

  std::shared_ptr<const void> hold_;  // first: let go last, after the destructor has cancelled on engine_
  Engine& engine_;
  JobRegistry& registry_;
  std::shared_ptr<Shared> shared_;  // also held by the engine callbacks, which may outlive the job
  std::vector<RequestId> ids_;
  size_t n_choices_ = 0;  // sum of the requests' n
  size_t finals_taken_ = 0;
};

}  // namespace kvserve::server
