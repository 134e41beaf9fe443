#pragma once
// Helpers shared by the tests: temporary files and model locations.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/synth.h"

namespace kvserve::test_util {

// A file path under the system temp dir, removed when the object dies.
class TempFile {
 public:
  explicit TempFile(const std::string& suffix) {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("kvserve_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + suffix))
                .string();
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

  void write(const std::vector<uint8_t>& bytes) const {
    std::ofstream f(path_, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

 private:
  std::string path_;
};

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// The project's models/ folder (filled by scripts/setup.sh); KVSERVE_MODEL_DIR overrides.
inline std::string model_dir() { return env_or("KVSERVE_MODEL_DIR", std::string(KVSERVE_SOURCE_DIR) + "/models"); }

// The real default model, or "" when it has not been fetched.
inline std::string default_model_path() {
  const std::string p = model_dir() + "/smollm2-135m-instruct-q4_1.gguf";
  return std::filesystem::exists(p) ? p : "";
}

// ../shared/models (real llama2.c checkpoints): KVSERVE_SHARED_MODELS, else
// shared/ beside the clone (CI), else beside the folder holding the clone (a
// git worktree).
inline std::string shared_models_dir() {
  if (const char* env = std::getenv("KVSERVE_SHARED_MODELS")) return env;
  const std::string beside = std::string(KVSERVE_SOURCE_DIR) + "/../shared/models";
  const std::string above = std::string(KVSERVE_SOURCE_DIR) + "/../../shared/models";
  return std::filesystem::exists(beside) || !std::filesystem::exists(above) ? beside : above;
}

// n normal floats with standard deviation `scale`.
inline std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |a - b| / max |b|: the error relative to the output's magnitude.
inline double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(b[i])));
  }
  return diff / mag;
}

// Writes a random-weight model of a `kvserve synth` preset to `path` (the
// tests' tiny models).
inline void write_synth_model(const std::string& path, const std::string& preset = "tiny-llama",
                              DType type = DType::F32, uint64_t seed = 1) {
  SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.output_path = path;
  o.seed = seed;
  synthesize_model(o);
}

// The kvserve binary's exit code and its stdout + stderr.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

inline CommandResult run_kvserve(const std::string& args) {
  const std::string command = std::string(KVSERVE_BINARY) + " " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Waits until an Engine has nothing running or waiting, then for the metrics
// snapshot that follows the last step.
template <typename EngineT>
void wait_idle(const EngineT& engine) {
  for (int i = 0; i < 200 && (engine.metrics().running > 0 || engine.metrics().waiting > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Tests that take more than a few seconds unoptimized skip themselves under
// the sanitizer run (they ran in the Release suite).
inline bool skip_slow() { return std::getenv("KVSERVE_SKIP_SLOW") != nullptr; }

}  // namespace kvserve::test_util
