#include "server/model_router.h"

#include <malloc.h>

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

namespace {

// Frees unloaded models (their last references, outside the router's lock) and gives the freed heap back to the
// system: once glibc's mmap threshold has grown past a freed pool's size it keeps such blocks in its heap, and an
// unloaded model's K/V pool and repacked weights would stay resident (docs/server.md, "Memory budget").
void free_models(std::vector<std::shared_ptr<ServedModel>>& models) {
  if (models.empty()) return;
  models.clear();
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

void free_model(std::shared_ptr<ServedModel>& model) {
  std::vector<std::shared_ptr<ServedModel>> one;
  if (model) one.push_back(std::move(model));
  free_models(one);
}

}  // namespace

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

ModelRouter::ModelRouter(std::vector<ModelSource> sources, RouterLimits limits, ModelLoader loader, ModelSizer sizer)
    : fixed_(false), limits_(limits), loader_(std::move(loader)), sizer_(std::move(sizer)) {
  if (sources.empty()) throw Error("no models to serve");
  if (limits_.max_loaded < 1) throw Error("--models-max must be at least 1");
  if (limits_.memory_budget < 0) throw Error("--models-memory must not be negative");
  if (limits_.memory_budget > 0 && !sizer_) throw Error("a memory budget needs a way to size the models");
  for (ModelSource& s : sources) {
    for (const Slot& other : slots_)
      if (other.source.id == s.id)
        throw Error("two models have the id \"" + s.id + "\": " + other.source.path + " and " + s.path);
    Slot slot;
    slot.source = std::move(s);
    slots_.push_back(std::move(slot));
  }
  counters_.memory_budget = limits_.memory_budget;
  expiry_thread_ = std::thread([this] { expire_loop(); });
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

// A name, or none: the most recently used loaded model, else the first.
size_t ModelRouter::pick_locked(const std::string& requested) const {
  if (!requested.empty() || fixed_) return index_of(requested);
  size_t index = 0;
  uint64_t latest = 0;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].state == State::kLoaded && slots_[i].last_used >= latest) {
      latest = slots_[i].last_used;
      index = i;
    }
  return index;
}

ModelRouter::Lease ModelRouter::lease_locked(size_t index, bool touch, std::optional<KeepAlive> keep_alive) {
  Slot& slot = slots_[index];
  ++slot.active;
  if (touch) slot.last_used = ++tick_;
  if (touch && !fixed_) {  // a request: its keep_alive (or the server's) holds from when the model goes idle
    slot.keep_alive = keep_alive.value_or(limits_.keep_alive);
    slot.unload_when_idle = slot.keep_alive.count() == 0;
  }
  // Made in place: a temporary LeaseToken would release on destruction.
  std::shared_ptr<LeaseToken> token(new LeaseToken{this, index, touch, slot.model});
  ServedModel* model = token->model.get();
  return Lease(std::move(token), model);
}

std::shared_ptr<ServedModel> ModelRouter::unload_locked(size_t index) {
  Slot& slot = slots_[index];
  slot.state = State::kUnloaded;
  slot.unload_when_idle = false;
  slot.expires_at.reset();
  ++counters_.unloads;
  --counters_.loaded;
  return std::move(slot.model);
}

void ModelRouter::release(size_t index, bool touch) {
  std::shared_ptr<ServedModel> unloaded;  // freed after the lock is let go
  {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[index];
    --slot.active;
    if (touch) slot.last_used = ++tick_;
    if (slot.active == 0 && slot.state == State::kLoaded) {
      if (slot.unload_when_idle) unloaded = unload_locked(index);
      else if (touch && slot.keep_alive.count() > 0) slot.expires_at = Clock::now() + slot.keep_alive;
      else if (touch) slot.expires_at.reset();
    }
  }
  free_model(unloaded);  // before the wake-up: a request waiting for memory finds it given back
  changed_.notify_all();
  expiry_changed_.notify_all();
}

int64_t ModelRouter::used_memory_locked() const {
  int64_t used = 0;
  for (const Slot& s : slots_)
    if (s.state != State::kUnloaded && s.memory) used += s.memory->total();
  return used;
}

bool ModelRouter::make_room_locked(size_t index, std::vector<std::shared_ptr<ServedModel>>& freed) {
  const int64_t need = limits_.memory_budget > 0 && slots_[index].memory ? slots_[index].memory->total() : 0;
  size_t in_use = 0;
  std::vector<size_t> idle;  // loaded with no lease out, least recently used first
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].state == State::kUnloaded) continue;
    ++in_use;
    if (slots_[i].state == State::kLoaded && slots_[i].active == 0) idle.push_back(i);
  }
  std::sort(idle.begin(), idle.end(), [&](size_t a, size_t b) { return slots_[a].last_used < slots_[b].last_used; });
  int64_t used = used_memory_locked();
  auto fits = [&] { return in_use < limits_.max_loaded && (limits_.memory_budget == 0 || used + need <= limits_.memory_budget); };
  size_t victims = 0;
  for (; victims < idle.size() && !fits(); ++victims) {
    --in_use;
    used -= slots_[idle[victims]].memory ? slots_[idle[victims]].memory->total() : 0;
  }
  if (!fits()) return false;
  for (size_t v = 0; v < victims; ++v) freed.push_back(unload_locked(idle[v]));
  return true;
}

ApiError ModelRouter::load_failure_locked(size_t index, const std::string& why) {
  ++counters_.load_failures;
  const ModelSource& source = slots_[index].source;
  return ApiError(500, "model \"" + source.id + "\" failed to load from " + source.path + ": " + why, "model",
                  "server_error");
}

void ModelRouter::size_locked(std::unique_lock<std::mutex>& lock, size_t index) {
  const ModelSource source = slots_[index].source;
  lock.unlock();
  std::optional<ModelMemory> memory;
  std::string failure;
  try {
    memory = sizer_(source);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  lock.lock();
  if (!memory) throw load_failure_locked(index, failure);
  if (!slots_[index].memory) slots_[index].memory = memory;
}

ModelRouter::Lease ModelRouter::acquire(const std::string& requested, std::optional<KeepAlive> keep_alive) {
  std::unique_lock lock(mutex_);
  const size_t index = pick_locked(requested);
  const auto deadline = Clock::now() + limits_.slot_wait;
  for (;;) {
    if (shut_down_) throw ApiError(503, "the server is shutting down", {}, "server_error");
    Slot& slot = slots_[index];
    if (slot.state == State::kLoaded) {
      // Requests already waiting for room go first (see room_waiters_); past the wait this one runs anyway.
      if (room_waiters_ > 0 && !fixed_ && changed_.wait_until(lock, deadline) == std::cv_status::no_timeout) continue;
      return lease_locked(index, true, keep_alive);
    }
    if (slot.state == State::kLoading) {  // another request loads it: wait for that
      changed_.wait(lock);
      continue;
    }
    if (limits_.memory_budget > 0 && !slot.memory) {
      size_locked(lock, index);
      continue;  // the lock was let go: look again
    }
    const int64_t need = limits_.memory_budget > 0 ? slot.memory->total() : 0;
    if (need > limits_.memory_budget && limits_.memory_budget > 0) {
      ++counters_.load_failures;
      throw ApiError(500,
                     "model \"" + slot.source.id + "\" needs " + format_bytes(need) + " (weights " +
                         format_bytes(slot.memory->weights) + " + KV pool " + format_bytes(slot.memory->kv) +
                         "), more than --models-memory " + format_bytes(limits_.memory_budget),
                     "model", "server_error");
    }
    std::vector<std::shared_ptr<ServedModel>> freed;
    if (make_room_locked(index, freed)) return load_locked(lock, index, keep_alive, std::move(freed));
    // Busy models hold the slots or the memory it needs: wait for one to go idle.
    ++room_waiters_;
    const std::cv_status waited = changed_.wait_until(lock, deadline);
    --room_waiters_;
    if (room_waiters_ == 0) changed_.notify_all();  // the requests that deferred to it go on
    if (waited == std::cv_status::timeout && Clock::now() >= deadline) {
      const std::string why = limits_.memory_budget > 0
                                  ? "busy models hold " + format_bytes(used_memory_locked()) + " of --models-memory " +
                                        format_bytes(limits_.memory_budget) + " and it needs " + format_bytes(need)
                                  : "all " + std::to_string(limits_.max_loaded) + " loaded models stayed busy (--models-max)";
      throw ApiError(503, "model \"" + slot.source.id + "\" waits for a slot: " + why, {}, "server_error");
    }
  }
}

ModelRouter::Lease ModelRouter::load_locked(std::unique_lock<std::mutex>& lock, size_t index,
                                            std::optional<KeepAlive> keep_alive,
                                            std::vector<std::shared_ptr<ServedModel>> freed) {
  slots_[index].state = State::kLoading;  // its room is taken: counted in --models-max and --models-memory
  const ModelSource source = slots_[index].source;
  lock.unlock();
  free_models(freed);  // the unloaded models' memory goes back before this one loads
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
    ApiError error = load_failure_locked(index, failure);
    lock.unlock();
    changed_.notify_all();
    throw error;
  }
  if (sizer_) s.memory = loaded->memory();  // measured: what the next load of it is counted with
  s.model = std::shared_ptr<ServedModel>(std::move(loaded));
  s.state = State::kLoaded;
  ++counters_.loads;
  ++counters_.loaded;
  Lease lease = lease_locked(index, true, keep_alive);
  if (shut_down_) s.model->engine.shutdown(false);
  lock.unlock();
  changed_.notify_all();
  return lease;
}

std::string ModelRouter::unload(const std::string& requested) {
  if (fixed_) throw ApiError(400, "this server serves one model (-m): it stays loaded", "model");
  std::shared_ptr<ServedModel> unloaded;
  {
    std::lock_guard lock(mutex_);
    const size_t index = index_of(requested);
    Slot& slot = slots_[index];
    if (slot.state != State::kLoaded) return "not loaded";
    if (slot.active > 0) {
      slot.unload_when_idle = true;
      return "unloading";
    }
    unloaded = unload_locked(index);
  }
  free_model(unloaded);
  changed_.notify_all();
  return "unloaded";
}

void ModelRouter::expire_loop() {
  std::unique_lock lock(mutex_);
  while (!shut_down_) {
    const Clock::time_point now = Clock::now();
    std::vector<std::shared_ptr<ServedModel>> expired;
    std::optional<Clock::time_point> next;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.state != State::kLoaded || s.active > 0 || !s.expires_at) continue;
      if (*s.expires_at <= now) expired.push_back(unload_locked(i));
      else if (!next || *s.expires_at < *next) next = s.expires_at;
    }
    if (!expired.empty()) {
      lock.unlock();
      free_models(expired);  // outside the lock
      changed_.notify_all();
      lock.lock();
      continue;
    }
    if (next) expiry_changed_.wait_until(lock, *next);
    else expiry_changed_.wait(lock);
  }
}

std::vector<ModelRouter::Entry> ModelRouter::entries(bool leases_for_loaded) {
  std::lock_guard lock(mutex_);
  std::vector<Entry> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    Entry e{s.source.id, s.source.path,
            s.state == State::kLoaded ? "loaded" : s.state == State::kLoading ? "loading" : "unloaded", nullptr,
            s.last_used, s.memory ? s.memory->total() : 0, s.active == 0 ? s.expires_at : std::nullopt};
    if (leases_for_loaded && s.state == State::kLoaded) {
      e.model = lease_locked(i, false, std::nullopt);  // a look, not a use: the LRU order stays
    }
    out.push_back(std::move(e));
  }
  return out;
}

RouterCounters ModelRouter::counters() const {
  std::lock_guard lock(mutex_);
  RouterCounters c = counters_;
  c.memory_used = used_memory_locked();
  return c;
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
  expiry_changed_.notify_all();
  std::call_once(expiry_joined_, [this] {
    if (expiry_thread_.joinable()) expiry_thread_.join();
  });
  for (auto& m : loaded) m->engine.shutdown(false);
}

}  // namespace kvserve::server
