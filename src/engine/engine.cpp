// First implementation of the Engine boundary: one sequence at a time through
// a CachedDecoder, on the engine thread. The public API is what continuous
// batching keeps; only Impl changes.
#include "engine/engine.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "engine/decoder.h"
#include "engine/stop_strings.h"

namespace kvserve {
namespace {

struct Pending {
  RequestId id;
  GenerationRequest request;
  EventCallback on_event;
};

TokenLogprob logprob_of(std::span<const float> logits, int32_t id, int32_t top, std::vector<float>& scratch) {
  Sampler::log_softmax(logits, scratch);
  TokenLogprob lp{id, scratch[static_cast<size_t>(id)], {}};
  if (top > 0) {
    std::vector<int32_t> ids(scratch.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const auto k = std::min<size_t>(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) { return scratch[static_cast<size_t>(a)] > scratch[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < k; ++i) lp.top.emplace_back(ids[i], scratch[static_cast<size_t>(ids[i])]);
  }
  return lp;
}

}  // namespace

class Engine::Impl {
 public:
  Impl(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
      : model_(model), tokenizer_(tokenizer), options_(options),
        decoder_(model, std::min(options.max_context, model.config().context_length)),
        thread_([this] { loop(); }) {}

  ~Impl() {
    shutdown(false);
    thread_.join();
  }

  std::optional<RequestId> submit(GenerationRequest request, EventCallback on_event) {
    validate(request);
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int64_t>(queue_.size()) >= options_.max_queue) return std::nullopt;
    const RequestId id = next_id_++;
    queue_.push_back({id, std::move(request), std::move(on_event)});
    metrics_.waiting = static_cast<int64_t>(queue_.size());
    wake_.notify_all();
    return id;
  }

  void cancel(RequestId id) {
    std::lock_guard lock(mutex_);
    cancelled_.insert(id);
    wake_.notify_all();
  }

  EngineMetrics metrics() const {
    std::lock_guard lock(mutex_);
    return metrics_;
  }

  void shutdown(bool finish_running) {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    if (!finish_running) {
      for (const Pending& p : queue_) cancelled_.insert(p.id);
      if (current_ != 0) cancelled_.insert(current_);
    }
    wake_.notify_all();
    idle_.wait(lock, [this] { return queue_.empty() && current_ == 0; });
    exit_ = true;
    wake_.notify_all();
  }

  const EngineOptions& options() const { return options_; }

 private:
  void validate(const GenerationRequest& r) const {
    if (r.prompt.empty()) throw Error("the prompt is empty");
    if (r.max_tokens < 0) throw Error("max_tokens must be >= 0, got " + std::to_string(r.max_tokens));
    const int64_t limit = decoder_.max_context();
    if (static_cast<int64_t>(r.prompt.size()) >= limit)
      throw Error("the prompt has " + std::to_string(r.prompt.size()) + " tokens; the context size is " +
                  std::to_string(limit) + " tokens");
    for (int32_t id : r.prompt)
      if (id < 0 || id >= model_.config().vocab_size) throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary");
    r.sampling.validate();
  }

  bool is_cancelled(RequestId id) {
    std::lock_guard lock(mutex_);
    return cancelled_.count(id) != 0;
  }

  void loop() {
    for (;;) {
      Pending p;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return exit_ || !queue_.empty(); });
        if (exit_ && queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
        current_ = p.id;
        metrics_.waiting = static_cast<int64_t>(queue_.size());
        metrics_.running = 1;
      }
      run(p);
      std::lock_guard lock(mutex_);
      cancelled_.erase(p.id);
      current_ = 0;
      metrics_.running = 0;
      metrics_.requests_finished++;
      idle_.notify_all();
    }
  }

  void run(Pending& p) {
    GenerationEvent ev;
    ev.id = p.id;
    ev.prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
    try {
      generate_one(p, ev);
    } catch (const std::exception& e) {
      ev.tokens.clear();
      ev.text.clear();
      ev.logprobs.clear();
      ev.finished = true;
      ev.finish_reason = "error";
      ev.error = e.what();
      p.on_event(ev);
    }
  }

  void generate_one(Pending& p, GenerationEvent& ev) {
    const GenerationRequest& r = p.request;
    Sampler sampler(r.sampling);
    TokenTextStream stream(tokenizer_);
    StopStringMatcher stops(r.stop);
    std::vector<int32_t> history = r.prompt;
    std::vector<float> logits, scratch;
    decoder_.reset();
    std::span<const float> out = decoder_.append(r.prompt);
    {
      std::lock_guard lock(mutex_);
      metrics_.prompt_tokens_total += ev.prompt_tokens;
    }
    const int64_t budget = std::min(r.max_tokens, decoder_.max_context() - decoder_.length() + 1);
    ev.finish_reason = "length";
    for (int64_t i = 0; i < budget; ++i) {
      if (is_cancelled(p.id)) {
        ev.finish_reason = "cancelled";
        break;
      }
      logits.assign(out.begin(), out.end());
      const int32_t id = sampler.sample(logits, history);
      history.push_back(id);
      ev.completion_tokens++;
      ev.tokens = {id};
      ev.logprobs.clear();
      if (r.top_logprobs >= 0) ev.logprobs.push_back(logprob_of(out, id, r.top_logprobs, scratch));
      const bool eog = !r.ignore_eos && tokenizer_.is_end_of_generation(id);
      ev.text = eog ? stops.flush() : stops.push(stream.push(id));
      {
        std::lock_guard lock(mutex_);
        metrics_.generated_tokens_total++;
      }
      if (eog || stops.stopped()) {
        ev.finish_reason = "stop";
        break;
      }
      if (i + 1 == budget) break;
      p.on_event(ev);
      out = decoder_.append(std::span<const int32_t>(&id, 1));
    }
    if (ev.finish_reason == "length") ev.text += stops.push(stream.flush()) + stops.flush();
    if (ev.finish_reason == "cancelled") {
      ev.tokens.clear();
      ev.text.clear();
      ev.logprobs.clear();
    }
    ev.finished = true;
    p.on_event(ev);
  }

  const Model& model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  CachedDecoder decoder_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Pending> queue_;
  std::set<RequestId> cancelled_;
  RequestId next_id_ = 1;
  RequestId current_ = 0;
  bool stopping_ = false;
  bool exit_ = false;
  EngineMetrics metrics_;
  std::thread thread_;  // last: starts after every other member is ready
};

Engine::Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, options)) {}
Engine::~Engine() = default;
std::optional<RequestId> Engine::submit(GenerationRequest request, EventCallback on_event) {
  return impl_->submit(std::move(request), std::move(on_event));
}
void Engine::cancel(RequestId id) { impl_->cancel(id); }
EngineMetrics Engine::metrics() const { return impl_->metrics(); }
void Engine::shutdown(bool finish_running) { impl_->shutdown(finish_running); }
const EngineOptions& Engine::options() const { return impl_->options(); }

}  // namespace kvserve
