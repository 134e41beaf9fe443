#include "server/generation_job.h"

#include "server/api_error.h"

namespace kvserve::server {

struct GenerationJob::Shared {
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<ChoiceEvent> events;
  ServerMetrics* metrics = nullptr;
  Clock::time_point arrival;
  std::vector<std::optional<Clock::time_point>> last_token;  // per choice: when its latest tokens came

  // Runs on the engine thread: time the tokens, queue the event, wake the HTTP thread.
  void on_event(size_t choice, const GenerationEvent& event) {
    const Clock::time_point now = Clock::now();
    std::lock_guard lock(mutex);
    if (!event.tokens.empty()) {
      auto& last = last_token[choice];
      if (!last) {
        metrics->time_to_first_token.observe(std::chrono::duration<double>(now - arrival).count());
      } else {
        // An event may carry several tokens (a UTF-8 character split over tokens); spread the gap over them.
        const double gap = std::chrono::duration<double>(now - *last).count() / static_cast<double>(event.tokens.size());
        for (size_t i = 0; i < event.tokens.size(); ++i) metrics->inter_token_latency.observe(gap);
      }
      last = now;
    }
    events.push_back({choice, event, now});
    arrived.notify_one();
  }
};

void JobRegistry::add(GenerationJob* job) {
  std::lock_guard lock(mutex_);
  jobs_.insert(job);
}

void JobRegistry::remove(GenerationJob* job) {
  std::lock_guard lock(mutex_);
  jobs_.erase(job);
  if (jobs_.empty()) emptied_.notify_all();
}

void JobRegistry::cancel_all() {
  std::lock_guard lock(mutex_);
  for (GenerationJob* job : jobs_) job->cancel();
}

bool JobRegistry::wait_until_empty(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return emptied_.wait_for(lock, timeout, [this] { return jobs_.empty(); });
}

GenerationJob::GenerationJob(Engine& engine, ServerMetrics& metrics, JobRegistry& registry,
                             std::vector<ValidatedRequest> requests, Clock::time_point arrival,
                             std::shared_ptr<const void> hold)
    : hold_(std::move(hold)), engine_(engine), registry_(registry), shared_(std::make_shared<Shared>()) {
  shared_->metrics = &metrics;
  shared_->arrival = arrival;
  for (const ValidatedRequest& r : requests) n_choices_ += static_cast<size_t>(r.request().n);
  shared_->last_token.resize(n_choices_);
  try {
    submit_all(std::move(requests));
  } catch (...) {
    cancel();
    throw;
  }
  registry_.add(this);
}

void GenerationJob::submit_all(std::vector<ValidatedRequest> requests) {
  // OpenAI's choices[i] is a sequence: request k's sequence j (GenerationEvent::index) is choice first_choice + j.
  size_t first_choice = 0;
  for (ValidatedRequest& request : requests) {
    const auto n = static_cast<size_t>(request.request().n);
    auto on_event = [shared = shared_, first_choice](const GenerationEvent& ev) {
      shared->on_event(first_choice + static_cast<size_t>(ev.index), ev);
    };
    first_choice += n;
    const std::optional<RequestId> id = engine_.submit_validated(std::move(request), std::move(on_event));
    if (!id) {
      shared_->metrics->requests_rejected++;
      throw ApiError(429, "the server is at capacity (request queue full); retry shortly", {}, "rate_limit_error");
    }
    ids_.push_back(*id);
  }
}

GenerationJob::~GenerationJob() {
  if (!done()) cancel();
  registry_.remove(this);
}

std::optional<ChoiceEvent> GenerationJob::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(shared_->mutex);
  if (!shared_->arrived.wait_for(lock, timeout, [this] { return !shared_->events.empty(); })) return std::nullopt;
  ChoiceEvent out = std::move(shared_->events.front());
  shared_->events.pop_front();
  if (out.event.finished) ++finals_taken_;
  return out;
}

void GenerationJob::cancel() {
  for (RequestId id : ids_) engine_.cancel(id);
}

}  // namespace kvserve::server
