#pragma once
// What the server measures itself (latencies as clients see them, refusals)
// and the Prometheus text exposition of those plus the engine's counters.
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "engine/engine.h"

namespace kvserve::server {

// A Prometheus histogram with fixed buckets; observe() is lock-free.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1,     2.5,  5,     10,  30};
  void observe(double seconds);
  // The # TYPE line and the _bucket / _sum / _count samples.
  std::string render(const std::string& name, const std::string& help) const;
  int64_t count() const { return count_.load(); }

 private:
  std::array<std::atomic<int64_t>, kBounds.size() + 1> buckets_{};  // the last is +Inf
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_micros_{0};
};

struct ServerMetrics {
  LatencyHistogram time_to_first_token;  // request arrival -> first generated text
  LatencyHistogram inter_token_latency;  // between generated tokens of one choice
  std::atomic<int64_t> requests_rejected{0};  // 429: the engine queue was full
  std::atomic<int64_t> client_disconnects{0};  // requests (streaming or not) cancelled because the client left

  // kvserve's own names, then the gauges the Gateway API Inference Extension's
  // model-server protocol asks for under vLLM's names (routers such as SGLang's
  // read them for load): labelled with the served model's id like vLLM's.
  std::string render(const EngineMetrics& engine, const std::string& model_id, int64_t block_size) const;
  // render()'s parts, for a many-model server that labels each model's engine series (metric_labels.h):
  // the engine's kvserve_ series; the server's own (refusals, disconnects, latency histograms); vLLM's names.
  static std::string render_engine(const EngineMetrics& engine);
  std::string render_server() const;
  static std::string render_engine_vllm(const EngineMetrics& engine, const std::string& model_id, int64_t block_size);
};

}  // namespace kvserve::server
