#pragma once
// Many models behind one server (serve -m A -m B, --models-dir): which model a
// request's "model" names, loading it on demand, at most max_loaded at once,
// unloading the least recently used idle one first (docs/server.md, "Many
// models"). A request holds a Lease (a shared_ptr to its ServedModel) for as
// long as it uses the model; a model with a lease out is busy and is never
// unloaded under it. A single -m server is a router over one fixed model that
// never unloads and ignores the names requests give (today's behaviour).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/keep_alive.h"
#include "server/model_memory.h"
#include "server/model_presets.h"
#include "server/served_model.h"

namespace kvserve::server {

// A configured model: its id (the file name without .gguf, or a preset's section) and file, and the options a
// presets file gives it (the loader's business; the router does not read them).
struct ModelSource {
  ModelSource() = default;
  ModelSource(std::string id_in, std::string path_in, ModelOptions options_in = {})
      : id(std::move(id_in)), path(std::move(path_in)), options(std::move(options_in)) {}
  std::string id;
  std::string path;
  ModelOptions options;
};

// Every *.gguf in dir, sorted by id; throws kvserve::Error when dir cannot be read.
std::vector<ModelSource> models_in_dir(const std::string& dir);

struct RouterLimits {
  size_t max_loaded = 1;  // models loaded at once
  // How long a request waits for a model slot while every loaded model is busy (then 503).
  std::chrono::milliseconds slot_wait{std::chrono::minutes(5)};
  // --models-memory: bytes the loaded models' weights and K/V pools may take together (ModelMemory); 0: no budget.
  int64_t memory_budget = 0;
  // --keep-alive: how long a model stays loaded after its last request when the request gave no keep_alive.
  KeepAlive keep_alive = kKeepForever;
};

// Loads one configured model; throws when it cannot.
using ModelLoader = std::function<std::unique_ptr<ServedModel>(const ModelSource& source)>;
// What a configured model will hold once loaded (estimate_model_memory); throws when it cannot tell.
using ModelSizer = std::function<ModelMemory(const ModelSource& source)>;

struct RouterCounters {
  uint64_t loads = 0;
  uint64_t unloads = 0;
  uint64_t load_failures = 0;
  size_t loaded = 0;
  int64_t memory_budget = 0;  // bytes (0: none)
  int64_t memory_used = 0;    // bytes counted for the loaded and loading models
};

class ModelRouter {
 public:
  using Lease = std::shared_ptr<ServedModel>;

  // One fixed model: every request gets it, whatever it names.
  explicit ModelRouter(std::shared_ptr<ServedModel> fixed);
  // Several models, none loaded yet; sizer (needed with a memory budget) tells what one will hold before it
  // loads. Starts the thread that unloads idle models past their keep_alive. Throws kvserve::Error on no
  // sources, a repeated id, or a budget without a sizer.
  ModelRouter(std::vector<ModelSource> sources, RouterLimits limits, ModelLoader loader, ModelSizer sizer = nullptr);
  ~ModelRouter();
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  bool fixed() const { return fixed_; }
  // The model a request names ("" : the most recently used loaded one, else the first configured), loaded if it is
  // not, waiting for a slot (--models-max) and for memory (--models-memory) while busy models hold them; idle
  // models are unloaded least recently used first to make room. keep_alive: how long the model stays loaded once
  // idle (nullopt: the server's default; 0: unloaded when its requests end). Throws ApiError: 404 naming the
  // available models for an unknown one, 500 when its file fails to load (the next request tries again) or it
  // needs more than the whole budget, 503 after the slot wait or once shutdown() began.
  Lease acquire(const std::string& requested, std::optional<KeepAlive> keep_alive = std::nullopt);
  // Unloads the named model now if it is idle, else once its last request ends. Returns "unloaded",
  // "unloading" or "not loaded". Throws ApiError 404 for an unknown model, 400 on a fixed router.
  std::string unload(const std::string& requested);
  // The id a request's name resolves to (the id, or Ollama's "id:latest"); throws ApiError 404.
  const std::string& resolve(const std::string& requested) const;

  // Every configured model: {id, path, status: "loaded" | "loading" | "unloaded", the loaded one's lease}.
  struct Entry {
    std::string id;
    std::string path;
    std::string status;
    Lease model;  // null unless loaded (a lease: it keeps the model loaded while the caller looks)
    uint64_t last_used = 0;  // larger: used more recently
    int64_t memory = 0;      // bytes counted for it (estimate or measured; 0: not known yet)
    std::optional<std::chrono::steady_clock::time_point> expires_at;  // idle with a finite keep_alive
  };
  // Every configured model, in the configured order; leases_for_loaded: hand out leases to the loaded ones.
  std::vector<Entry> entries(bool leases_for_loaded);
  RouterCounters counters() const;
  // Refuses new leases (503), stops the keep_alive thread and shuts every loaded engine down (their requests
  // cancelled). Safe to call more than once, from any thread.
  void shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  enum class State { kUnloaded, kLoading, kLoaded };
  struct Slot {
    ModelSource source;
    State state = State::kUnloaded;
    std::shared_ptr<ServedModel> model;
    int64_t active = 0;       // leases out
    uint64_t last_used = 0;   // tick of the latest acquire or release
    bool unload_when_idle = false;
    std::optional<ModelMemory> memory;   // estimated before its first load, measured after each
    KeepAlive keep_alive = kKeepForever;  // the latest request's, or the server's default
    std::optional<Clock::time_point> expires_at;  // set when it goes idle with a finite keep_alive
  };
  struct LeaseToken;
  size_t pick_locked(const std::string& requested) const;
  Lease lease_locked(size_t index, bool touch, std::optional<KeepAlive> keep_alive);  // mutex_ held, slot loaded
  void release(size_t index, bool touch);
  // Marks the slot unloaded; returns its model, to be freed once the lock is let go.
  std::shared_ptr<ServedModel> unload_locked(size_t index);
  // Unloads idle models (least recently used first) until `index` fits under --models-max and --models-memory;
  // false (and nothing unloaded) when busy models hold what it needs.
  bool make_room_locked(size_t index, std::vector<std::shared_ptr<ServedModel>>& freed);
  int64_t used_memory_locked() const;
  // The slot's memory estimate, made outside the lock; throws ApiError 500 when the file cannot be read.
  void size_locked(std::unique_lock<std::mutex>& lock, size_t index);
  // Loads the slot (its room made; `freed` the models unloaded for it, freed first), outside the lock; returns a lease.
  Lease load_locked(std::unique_lock<std::mutex>& lock, size_t index, std::optional<KeepAlive> keep_alive,
                    std::vector<std::shared_ptr<ServedModel>> freed);
  ApiError load_failure_locked(size_t index, const std::string& why);
  void expire_loop();  // the keep_alive thread
  size_t index_of(const std::string& requested) const;
  std::string available() const;

  const bool fixed_;
  RouterLimits limits_;
  ModelLoader loader_;
  ModelSizer sizer_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable expiry_changed_;  // wakes the keep_alive thread
  std::vector<Slot> slots_;
  uint64_t tick_ = 0;
  // Requests waiting for busy models to make room for theirs. While there are any, new requests to a loaded
  // model wait behind them (up to the slot wait): the busy models drain and the waiting one loads, in arrival
  // order, instead of a model with a steady stream of requests keeping its slot for ever.
  int64_t room_waiters_ = 0;
  bool shut_down_ = false;
  RouterCounters counters_;
  std::thread expiry_thread_;  // many models only; joined by shutdown()
  std::once_flag expiry_joined_;
};

}  // namespace kvserve::server
