#pragma once
// What a served model holds in memory, as --models-memory counts it
// (docs/server.md, "Memory budget"): its weights and its engine's K/V pools.
#include <cstdint>
#include <string>

#include "engine/engine.h"

namespace kvserve::server {

struct ModelMemory {
  int64_t weights = 0;  // bytes: the files' sizes before loading; resident_weight_bytes() once loaded
  int64_t kv = 0;       // bytes: the K/V pools (a draft model's included), planned_kv_pool_bytes
  int64_t total() const { return weights + kv; }
};

// Before loading: the GGUF files' sizes (the model's and the draft's, when draft_path is not empty) and the
// K/V pools the engine will allocate with these options, from the files' headers only (no tensor is read).
// Throws kvserve::Error when a file cannot be read.
ModelMemory estimate_model_memory(const std::string& path, const std::string& draft_path,
                                  const EngineOptions& engine_options);

// "1.23 GiB" / "456.0 MiB": sizes in messages.
std::string format_bytes(int64_t bytes);

}  // namespace kvserve::server
