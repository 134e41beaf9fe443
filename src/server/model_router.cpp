#include "server/model_router.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "core/error.h"
#include "server/api_error.h"

namespace kvserve::server {

std::vector<ModelSource> models_in_dir(const std::string& dir) {
  std::error_code error;
  std::vector<ModelSource> out;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::filesystem::path& p = it->path();
    if (p.extension() != ".gguf") continue;
    std::error_code file_error;
    if (!std::filesystem::is_regular_file(p, file_error) && !std::filesystem::is_symlink(p, file_error)) continue;
    out.push_back({p.stem().string(), p.string()});
  }
  if (error) throw Error("--models-dir " + dir + ": " + error.message());
  std::sort(out.begin(), out.end(), [](const ModelSource& a, const ModelSource& b) { return a.id < b.id; });
  return out;
}

// Held by every copy of one lease: its release tells the router.
struct ModelRouter::LeaseToken {
  ModelRouter* router;
  size_t index;
  bool touch;  // its release counts as a use (the LRU order)
  std::shared_ptr<ServedModel> model;
  ~LeaseToken() {
    model.reset();  // the router's reference is then the last one: an unload frees the model at once
    router->release(index, touch);
  }
};

ModelRouter::ModelRouter(std::shared_ptr<ServedModel> fixed) : fixed_(true) {
  Slot slot;
  slot.source = {fixed->id, ""};
  slot.state = State::kLoaded;
  slot.model = std::move(fixed);
  slots_.push_back(std::move(slot));
  counters_.loaded = 1;
}

ModelRouter::ModelRouter(std::vector<ModelSource> sources, RouterLimits limits, ModelLoader loader)
    : fixed_(false), limits_(limits), loader_(std::move(loader)) {
  if (sources.empty()) throw Error("no models to serve");
  if (limits_.max_loaded < 1) throw Error("--models-max must be at least 1");
  for (ModelSource& s : sources) {
    for (const Slot& other : slots_)
      if (other.source.id == s.id)
        throw Error("two models have the id \"" + s.id + "\": " + other.source.path + " and " + s.path);
    Slot slot;
    slot.source = std::move(s);
    slots_.push_back(std::move(slot));
  }
}

ModelRouter::~ModelRouter() { shutdown(); }

std::string ModelRouter::available() const {
  std::string out;
  for (const Slot& s : slots_) out += (out.empty() ? "" : ", ") + s.source.id;
  return out;
}

size_t ModelRouter::index_of(const std::string& requested) const {
  if (fixed_) return 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const std::string& id = slots_[i].source.id;
    if (requested == id || requested == id + ":latest") return i;
  }
  throw ApiError(404, "model \"" + requested + "\" not found; available models: " + available(), "model",
                 "not_found_error");
}

const std::string& ModelRouter::resolve(const std::string& requested) const {
  return slots_[index_of(requested)].source.id;
}

ModelRouter::Lease ModelRouter::lease_locked(size_t index, bool touch) {
  Slot& slot = slots_[index];
  ++slot.active;
  if (touch) slot.last_used = ++tick_;
  // Made in place: a temporary LeaseToken would release on destruction.
  std::shared_ptr<LeaseToken> token(new LeaseToken{this, index, touch, slot.model});
  ServedModel* model = token->model.get();
  return Lease(std::move(token), model);
}

void ModelRouter::release(size_t index, bool touch) {
  std::shared_ptr<ServedModel> unloaded;  // freed after the lock is let go
  {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[index];
    --slot.active;
    if (touch) slot.last_used = ++tick_;
    if (slot.active == 0 && slot.unload_when_idle && slot.state == State::kLoaded) {
      unloaded = std::move(slot.model);
      slot.state = State::kUnloaded;
      slot.unload_when_idle = false;
      ++counters_.unloads;
      --counters_.loaded;
    }
  }
  changed_.notify_all();
}

ModelRouter::Lease ModelRouter::acquire(const std::string& requested) {
  std::unique_lock lock(mutex_);
  size_t index = 0;
  if (!requested.empty() || fixed_) {
    index = index_of(requested);
  } else {  // no name: the most recently used loaded model, else the first
    uint64_t latest = 0;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].state == State::kLoaded && slots_[i].last_used >= latest) {
        latest = slots_[i].last_used;
        index = i;
      }
  }
  const auto deadline = std::chrono::steady_clock::now() + limits_.slot_wait;
  for (;;) {
    if (shut_down_) throw ApiError(503, "the server is shutting down", {}, "server_error");
    Slot& slot = slots_[index];
    if (slot.state == State::kLoaded) return lease_locked(index, true);
    if (slot.state == State::kLoading) {  // another request loads it: wait for that
      changed_.wait(lock);
      continue;
    }
    // Unloaded: it needs a slot, made by unloading the least recently used idle model if none is free.
    size_t in_use = 0;
    std::optional<size_t> victim;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.state == State::kUnloaded) continue;
      ++in_use;
      if (s.state == State::kLoaded && s.active == 0 && (!victim || s.last_used < slots_[*victim].last_used)) victim = i;
    }
    if (in_use >= limits_.max_loaded && !victim) {  // every loaded model is busy: wait for one to go idle
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline)
        throw ApiError(503,
                       "model \"" + slot.source.id + "\" waits for a slot: all " + std::to_string(limits_.max_loaded) +
                           " loaded models stayed busy (--models-max)",
                       {}, "server_error");
      continue;
    }
    std::shared_ptr<ServedModel> unloaded;
    if (in_use >= limits_.max_loaded) {
      Slot& v = slots_[*victim];
      unloaded = std::move(v.model);
      v.state = State::kUnloaded;
      v.unload_when_idle = false;
      ++counters_.unloads;
      --counters_.loaded;
    }
    slot.state = State::kLoading;
    const ModelSource source = slot.source;
    lock.unlock();
    unloaded.reset();  // its memory goes back before the next model loads
    std::unique_ptr<ServedModel> loaded;
    std::string failure;
    try {
      loaded = loader_(source);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lock.lock();
    Slot& s = slots_[index];
    if (!loaded) {
      s.state = State::kUnloaded;
      ++counters_.load_failures;
      lock.unlock();
      changed_.notify_all();
      throw ApiError(500, "model \"" + source.id + "\" failed to load from " + source.path + ": " + failure, "model",
                     "server_error");
    }
    s.model = std::shared_ptr<ServedModel>(std::move(loaded));
    s.state = State::kLoaded;
    ++counters_.loads;
    ++counters_.loaded;
    Lease lease = lease_locked(index, true);
    if (shut_down_) s.model->engine.shutdown(false);
    lock.unlock();
    changed_.notify_all();
    return lease;
  }
}

std::string ModelRouter::unload(const std::string& requested) {
  if (fixed_) throw ApiError(400, "this server serves one model (-m): it stays loaded", "model");
  std::shared_ptr<ServedModel> unloaded;
  std::string answer;
  {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[index_of(requested)];
    if (slot.state != State::kLoaded) return "not loaded";
    if (slot.active > 0) {
      slot.unload_when_idle = true;
      return "unloading";
    }
    unloaded = std::move(slot.model);
    slot.state = State::kUnloaded;
    ++counters_.unloads;
    --counters_.loaded;
  }
  changed_.notify_all();
  unloaded.reset();
  return "unloaded";
}

std::vector<ModelRouter::Entry> ModelRouter::entries(bool leases_for_loaded) {
  std::lock_guard lock(mutex_);
  std::vector<Entry> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    Entry e{s.source.id, s.source.path,
            s.state == State::kLoaded ? "loaded" : s.state == State::kLoading ? "loading" : "unloaded", nullptr,
            s.last_used};
    if (leases_for_loaded && s.state == State::kLoaded) {
      e.model = lease_locked(i, false);  // a look, not a use: the LRU order stays
    }
    out.push_back(std::move(e));
  }
  return out;
}

RouterCounters ModelRouter::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

void ModelRouter::shutdown() {
  std::vector<std::shared_ptr<ServedModel>> loaded;
  {
    std::lock_guard lock(mutex_);
    shut_down_ = true;
    for (Slot& s : slots_)
      if (s.model) loaded.push_back(s.model);
  }
  changed_.notify_all();
  for (auto& m : loaded) m->engine.shutdown(false);
}

}  // namespace kvserve::server
