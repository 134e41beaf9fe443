#include "server/server_metrics.h"

#include <cmath>
#include <cstdio>

#include "server/metric_labels.h"

namespace kvserve::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void sample(std::string& out, const std::string& name, const char* type, const std::string& help, double value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + number(value) + "\n";
}

double ratio(int64_t num, int64_t den) { return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0; }

void render_speculation(std::string& out, const EngineMetrics& e) {
  sample(out, "kvserve_spec_rounds_total", "counter", "Speculative verifications (a token + drafts in one pass).",
         static_cast<double>(e.spec_rounds));
  sample(out, "kvserve_spec_draft_tokens_total", "counter", "Draft tokens proposed and verified.",
         static_cast<double>(e.spec_draft_tokens));
  sample(out, "kvserve_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
         static_cast<double>(e.spec_accepted_tokens));
  sample(out, "kvserve_spec_acceptance_rate", "gauge", "Draft tokens accepted / proposed.",
         ratio(e.spec_accepted_tokens, e.spec_draft_tokens));
  sample(out, "kvserve_spec_accepted_per_round", "gauge", "Mean draft tokens accepted per verification.",
         ratio(e.spec_accepted_tokens, e.spec_rounds));
}

// vLLM's names for the gauges and counters routers and the Gateway API
// Inference Extension scrape (its model-server protocol): queue, running
// requests, KV-cache use, prefix-cache hits and the cache's shape.
void render_vllm_names(std::string& out, const EngineMetrics& e, const std::string& model_id, int64_t block_size) {
  const std::string label = "{model_name=\"" + prometheus_label_value(model_id) + "\"}";
  auto labelled = [&](const std::string& name, const char* type, const std::string& help, double value) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += name + label + " " + number(value) + "\n";
  };
  auto d = [](int64_t v) { return static_cast<double>(v); };
  labelled("vllm:num_requests_running", "gauge", "Requests being decoded (kvserve_requests_running).", d(e.running));
  labelled("vllm:num_requests_waiting", "gauge", "Requests queued in the engine (kvserve_requests_waiting).",
           d(e.waiting));
  const double usage = ratio(e.kv_blocks_used, e.kv_blocks_total);
  labelled("vllm:kv_cache_usage_perc", "gauge", "KV blocks held by sequences / blocks in the pool (1 = full).", usage);
  labelled("vllm:gpu_cache_usage_perc", "gauge", "The same as vllm:kv_cache_usage_perc (vLLM v0's name).", usage);
  labelled("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           d(e.prefix_query_tokens));
  labelled("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
           d(e.prefix_hit_tokens));
  out += "# HELP vllm:cache_config_info The KV cache's block size (tokens) and size (blocks).\n"
         "# TYPE vllm:cache_config_info gauge\n"
         "vllm:cache_config_info{block_size=\"" + std::to_string(block_size) + "\",num_gpu_blocks=\"" +
         std::to_string(e.kv_blocks_total) + "\",enable_prefix_caching=\"True\"} 1\n";
}

}  // namespace

void LatencyHistogram::observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(std::llround(seconds * 1e6), std::memory_order_relaxed);
}

std::string LatencyHistogram::render(const std::string& name, const std::string& help) const {
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    const std::string le = i < kBounds.size() ? number(kBounds[i]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + number(static_cast<double>(sum_micros_.load()) * 1e-6) + "\n";
  out += name + "_count " + std::to_string(count_.load()) + "\n";
  return out;
}

std::string ServerMetrics::render(const EngineMetrics& e, const std::string& model_id, int64_t block_size) const {
  return render_engine(e) + render_server() + render_engine_vllm(e, model_id, block_size);
}

std::string ServerMetrics::render_engine(const EngineMetrics& e) {
  std::string out;
  auto d = [](int64_t v) { return static_cast<double>(v); };
  sample(out, "kvserve_requests_running", "gauge", "Requests being decoded.", d(e.running));
  sample(out, "kvserve_requests_waiting", "gauge", "Requests queued in the engine.", d(e.waiting));
  sample(out, "kvserve_kv_blocks_total", "gauge", "KV cache blocks in the pool.", d(e.kv_blocks_total));
  sample(out, "kvserve_kv_blocks_used", "gauge", "KV cache blocks held by sequences.", d(e.kv_blocks_used));
  sample(out, "kvserve_kv_blocks_free", "gauge", "KV cache blocks free.", d(e.kv_blocks_free));
  sample(out, "kvserve_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept for prefix reuse.", d(e.kv_blocks_cached));
  if (e.kv_sliding_blocks_total > 0) {  // Gemma 3's sliding-window layers: their own pool
    sample(out, "kvserve_kv_sliding_blocks_total", "gauge", "Sliding-window layers' KV blocks in their pool.",
           d(e.kv_sliding_blocks_total));
    sample(out, "kvserve_kv_sliding_blocks_used", "gauge", "Sliding-window layers' KV blocks held by sequences.",
           d(e.kv_sliding_blocks_used));
  }
  const double hit_rate = e.prefix_query_tokens > 0 ? d(e.prefix_hit_tokens) / d(e.prefix_query_tokens) : 0.0;
  sample(out, "kvserve_prefix_cache_hit_rate", "gauge", "Prompt tokens found in the prefix cache / looked up.", hit_rate);
  sample(out, "kvserve_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.",
         d(e.prefix_query_tokens));
  sample(out, "kvserve_prefix_cache_hit_tokens_total", "counter", "Prompt tokens found in the prefix cache.",
         d(e.prefix_hit_tokens));
  sample(out, "kvserve_prompt_tokens_total", "counter", "Prompt tokens computed.", d(e.prompt_tokens_total));
  sample(out, "kvserve_generation_tokens_total", "counter", "Tokens generated.", d(e.generated_tokens_total));
  sample(out, "kvserve_requests_finished_total", "counter", "Engine requests finished.", d(e.requests_finished));
  sample(out, "kvserve_preemptions_total", "counter", "Sequences preempted for KV memory.", d(e.preemptions));
  render_speculation(out, e);
  return out;
}

std::string ServerMetrics::render_server() const {
  std::string out;
  sample(out, "kvserve_requests_rejected_total", "counter", "Requests refused with 429 (queue full).",
         static_cast<double>(requests_rejected.load()));
  sample(out, "kvserve_client_disconnects_total", "counter", "Requests cancelled because the client went away.",
         static_cast<double>(client_disconnects.load()));
  out += time_to_first_token.render("kvserve_time_to_first_token_seconds",
                                    "Request arrival to first generated text, per choice, measured in the server.");
  out += inter_token_latency.render("kvserve_inter_token_latency_seconds",
                                    "Time between generated tokens of one choice, measured in the server.");
  return out;
}

std::string ServerMetrics::render_engine_vllm(const EngineMetrics& e, const std::string& model_id, int64_t block_size) {
  std::string out;
  render_vllm_names(out, e, model_id, block_size);
  return out;
}

}  // namespace kvserve::server
