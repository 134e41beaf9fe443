#include "server/model_memory.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "model/config.h"
#include "model/gguf.h"

namespace kvserve::server {
namespace {

int64_t file_bytes(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) throw Error(path + ": " + error.message());
  return static_cast<int64_t>(size);
}

}  // namespace

ModelMemory estimate_model_memory(const std::string& path, const std::string& draft_path,
                                  const EngineOptions& engine_options) {
  ModelMemory m;
  m.weights = file_bytes(path);
  const GGUFFile file(path);
  const ModelConfig config = ModelConfig::from_gguf(file);
  std::optional<ModelConfig> draft;
  if (!draft_path.empty()) {
    m.weights += file_bytes(draft_path);
    const GGUFFile draft_file(draft_path);
    draft = ModelConfig::from_gguf(draft_file);
  }
  m.kv = planned_kv_pool_bytes(config, engine_options, draft ? &*draft : nullptr);
  return m;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= int64_t{1} << 30) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  return buf;
}

}  // namespace kvserve::server
