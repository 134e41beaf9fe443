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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/served_model.h"

namespace kvserve::server {

// A configured model: its id (the file name without .gguf) and file.
struct ModelSource {
  std::string id;
  std::string path;
};

// Every *.gguf in dir, sorted by id; throws kvserve::Error when dir cannot be read.
std::vector<ModelSource> models_in_dir(const std::string& dir);

struct RouterLimits {
  size_t max_loaded = 1;  // models loaded at once
  // How long a request waits for a model slot while every loaded model is busy (then 503).
  std::chrono::milliseconds slot_wait{std::chrono::minutes(5)};
};

// Loads one configured model; throws when it cannot.
using ModelLoader = std::function<std::unique_ptr<ServedModel>(const ModelSource& source)>;

struct RouterCounters {
  uint64_t loads = 0;
  uint64_t unloads = 0;
  uint64_t load_failures = 0;
  size_t loaded = 0;
};

class ModelRouter {
 public:
  using Lease = std::shared_ptr<ServedModel>;

  // One fixed model: every request gets it, whatever it names.
  explicit ModelRouter(std::shared_ptr<ServedModel> fixed);
  // Several models, none loaded yet. Throws kvserve::Error on no sources or a repeated id.
  ModelRouter(std::vector<ModelSource> sources, RouterLimits limits, ModelLoader loader);
  ~ModelRouter();
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  bool fixed() const { return fixed_; }
  // The model a request names ("" : the most recently used loaded one, else the first configured), loaded if it is
  // not, waiting for a slot while every loaded model is busy. Throws ApiError: 404 naming the available models for an
  // unknown one, 500 when its file fails to load (the next request tries again), 503 after the slot wait or once
  // shutdown() began.
  Lease acquire(const std::string& requested);
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
  };
  // Every configured model, in the configured order; leases_for_loaded: hand out leases to the loaded ones.
  std::vector<Entry> entries(bool leases_for_loaded);
  RouterCounters counters() const;
  // Refuses new leases (503) and shuts every loaded engine down (their requests cancelled).
  void shutdown();

 private:
  enum class State { kUnloaded, kLoading, kLoaded };
  struct Slot {
    ModelSource source;
    State state = State::kUnloaded;
    std::shared_ptr<ServedModel> model;
    int64_t active = 0;       // leases out
    uint64_t last_used = 0;   // tick of the latest acquire or release
    bool unload_when_idle = false;
  };
  struct LeaseToken;
  Lease lease_locked(size_t index, bool touch);  // mutex_ held, slot loaded
  void release(size_t index, bool touch);
  size_t index_of(const std::string& requested) const;
  std::string available() const;

  const bool fixed_;
  RouterLimits limits_;
  ModelLoader loader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;
  uint64_t tick_ = 0;
  bool shut_down_ = false;
  RouterCounters counters_;
};

}  // namespace kvserve::server
