// `kvserve bench --serving`: a synthetic serving workload (src/loadgen/workload.h),
// in the manner of vLLM's benchmark_serving, replayed either through the
// in-process Engine under three schedules (static, continuous, continuous +
// prefix caching) or, with --url, against a running OpenAI-compatible server.
#include <omp.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <cstdio>
#include <memory>
#include <optional>

#include "apps/cmd_bench.h"
#include "loadgen/engine_load_driver.h"
#include "loadgen/http_load_driver.h"
#include "core/error.h"
#include "grammar/constraint_compiler.h"
#include "kv/kv_planner.h"
#include "kv/paged_kv_storage.h"
#include "model/gguf.h"

namespace kvserve::cli {
namespace {

loadgen::WorkloadOptions workload_options(const BenchOptions& o) {
  loadgen::WorkloadOptions w;
  w.requests = o.requests;
  w.request_rate = o.request_rate;
  w.max_prompt = o.n_prompt.front();
  w.max_output = o.n_gen.front();
  w.shared_prefix = o.shared_prefix;
  w.prefix_groups = o.prefix_groups;
  w.seed = o.seed;
  return w;
}

std::string count(int64_t n) { return std::to_string(n); }

// The pool the engine will allocate: bytes per token in the KV type, blocks,
// and how many sequences of the workload's longest length fit at once.
void print_kv_pool(const BenchOptions& o, const ModelConfig& c, const std::vector<loadgen::WorkItem>& items,
                   const loadgen::EnginePool& pool) {
  const EngineOptions eo = loadgen::engine_options(items, o.concurrency, loadgen::Schedule::kContinuous, pool);
  const int64_t per_block = PagedKVStorage::bytes_per_block(c.n_layers, eo.block_size, c.n_kv_heads, c.head_dim, eo.kv_type,
                                                            c.is_mla());
  const int64_t blocks = eo.kv_blocks > 0 ? eo.kv_blocks : eo.kv_memory_bytes / per_block;
  int64_t longest = 1;
  for (const loadgen::WorkItem& w : items) longest = std::max(longest, w.prompt_tokens + w.output_tokens);
  const int64_t blocks_per_seq = (longest + eo.block_size - 1) / eo.block_size;
  std::printf("KV %s: %lld bytes/token | pool %lld blocks x %lld tokens = %.1f MiB | fits %lld sequences of %lld tokens\n\n",
              o.kv_type.c_str(), static_cast<long long>(per_block / eo.block_size), static_cast<long long>(blocks),
              static_cast<long long>(eo.block_size), static_cast<double>(blocks * per_block) / (1 << 20),
              static_cast<long long>(blocks / blocks_per_seq), static_cast<long long>(longest));
}

// The schema of --schema: a file, or "builtin", a list of order lines long
// enough (64 of them) that no stream ends before its output length: free
// and constrained runs generate the same tokens.
std::string schema_text(const std::string& schema) {
  if (schema == "builtin")
    return R"({"type": "object", "properties": {"orders": {"type": "array", "minItems": 64, "maxItems": 64, "items": {"type": "object",
      "properties": {"item": {"type": "string", "maxLength": 24}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
      "express": {"type": "boolean"}}, "required": ["item", "qty", "express"]}}}, "required": ["orders"]})";
  std::ifstream in(schema);
  if (!in) throw Error("cannot read the schema file " + schema);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Continuous batching + prefix caching with free output, then with every
// request following the schema: throughput and TTFT side by side, with the
// compile time and the cache's hit rate.
int run_structured_bench(const BenchOptions& o, const Model& model, const Tokenizer& tokenizer,
                         const std::vector<loadgen::WorkItem>& items, loadgen::EnginePool pool) {
  ConstraintCompiler compiler(tokenizer, model.config().vocab_size);
  pool.compiler = &compiler;
  const ConstraintSpec spec{ConstraintKind::kJsonSchema, schema_text(o.schema), {}};
  compiler.compile(spec);  // the first request's compile, alone (the runs below hit the cache)
  const loadgen::ReportTable table({"tok/CPUs", "hit tk", "steps"});
  table.print_header(stdout);
  double free_rate = 0;
  for (bool constrained : {false, true}) {
    pool.constraint = constrained ? std::optional<ConstraintSpec>(spec) : std::nullopt;
    const loadgen::EngineLoadRun run = loadgen::run_engine_load(model, tokenizer, items, o.concurrency, loadgen::Schedule::kContinuousPrefix, pool);
    const loadgen::ServingSummary summary = loadgen::summarize(run.timings);
    char per_cpu[32];
    const double rate = static_cast<double>(summary.output_tokens) / run.cpu_s;
    std::snprintf(per_cpu, sizeof per_cpu, "%.1f", rate);
    table.print_row(stdout, constrained ? "+ json_schema" : "continuous + prefix", summary,
                    {per_cpu, count(run.metrics.prefix_hit_tokens), count(run.metrics.steps)});
    if (!constrained) free_rate = rate;
    else std::printf("\nconstrained / free output tokens per CPU-second: %.3f\n", rate / free_rate);
  }
  const ConstraintCompilerStats stats = compiler.stats();
  std::printf("schema compile %.1f ms (first request) | compiles %lld, cache hits %lld of %lld lookups (%.1f%%)\n",
              stats.compile_seconds * 1000, static_cast<long long>(stats.compiles), static_cast<long long>(stats.cache_hits),
              static_cast<long long>(stats.requests),
              100.0 * static_cast<double>(stats.cache_hits) / static_cast<double>(std::max<int64_t>(1, stats.requests)));
  return 0;
}

int run_engine_bench(const BenchOptions& o, const loadgen::WorkloadOptions& w, const PipelineSession& pipeline) {
  auto model = Model::load(o.models.front(), pipeline.load_options());
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  const std::vector<loadgen::WorkItem> items = loadgen::make_workload(w, &tokenizer);
  loadgen::EnginePool pool;
  pool.kv_type = parse_kv_type(o.kv_type, "--kv-type");
  pool.kv_memory_bytes = o.kv_mem_mib << 20;
  pool.pipeline = pipeline.engine_options();
  std::printf("model %s | %s | threads %d | activations %s\n", model->config().name.c_str(),
              loadgen::describe_workload(w, items, o.concurrency).c_str(), omp_get_max_threads(),
              activation_precision_name(activation_precision()));
  print_kv_pool(o, model->config(), items, pool);
  if (!o.schema.empty()) return run_structured_bench(o, *model, tokenizer, items, pool);
  const loadgen::ReportTable table({"tok/CPUs", "hit tk", "steps", "pre"});
  table.print_header(stdout);
  for (loadgen::Schedule s : {loadgen::Schedule::kStatic, loadgen::Schedule::kStaticEarlyExit, loadgen::Schedule::kContinuous, loadgen::Schedule::kContinuousPrefix}) {
    const loadgen::EngineLoadRun run = loadgen::run_engine_load(*model, tokenizer, items, o.concurrency, s, pool);
    const loadgen::ServingSummary summary = loadgen::summarize(run.timings);
    char per_cpu[32];
    std::snprintf(per_cpu, sizeof per_cpu, "%.1f", static_cast<double>(summary.output_tokens) / run.cpu_s);
    table.print_row(stdout, loadgen::schedule_name(s), summary,
                    {per_cpu, count(run.metrics.prefix_hit_tokens), count(run.metrics.steps), count(run.metrics.preemptions)});
  }
  pipeline.report(*model);
  return 0;
}

// The in-process engine, or rank 0 of a pipeline (the other ranks serve their stage meanwhile).
int run_engine_bench(const BenchOptions& o, const loadgen::WorkloadOptions& w) {
  if (o.threads.front() > 0) omp_set_num_threads(o.threads.front());
  PipelineSession pipeline(o.pipeline);
  int rc = 0;
  pipeline.guard([&] {
    if (pipeline.rank() != 0) return pipeline.run_stage(o.models.front());
    rc = run_engine_bench(o, w, pipeline);
  });
  return rc;
}

int run_remote_bench(const BenchOptions& o, const loadgen::WorkloadOptions& w) {
  // Prompt lengths: exact with the -m model's tokenizer, else one token per word.
  std::optional<Tokenizer> tokenizer;
  if (o.model_given) tokenizer.emplace(Tokenizer::from_gguf(GGUFFile(o.models.front())));
  const std::vector<loadgen::WorkItem> items = loadgen::make_workload(w, tokenizer ? &*tokenizer : nullptr);
  loadgen::HttpLoadOptions r;
  r.url = o.url;
  r.model = o.model_name;
  r.concurrency = o.concurrency;
  r.client.api_key = o.api_key;
  r.client.timeout_s = o.timeout_s;
  signal(SIGPIPE, SIG_IGN);  // a server that closes the connection must fail a write, not end the process
  const loadgen::HttpLoadRun run = loadgen::run_http_load(r, items);
  const loadgen::ServingSummary summary = loadgen::summarize(run.timings);
  std::printf("server %s, model %s | %s%s\n", o.url.c_str(), run.model.c_str(),
              loadgen::describe_workload(w, items, o.concurrency).c_str(),
              tokenizer ? "" : " (prompt tokens approximate: one per word; pass -m MODEL.gguf to count them)");
  std::printf("server-reported prompt tokens %lld (%lld of %zu requests reported usage), output tokens received %lld\n\n",
              static_cast<long long>(run.reported_prompt_tokens), static_cast<long long>(run.requests_with_usage),
              items.size(), static_cast<long long>(summary.output_tokens));
  const loadgen::ReportTable table;
  table.print_header(stdout);
  table.print_row(stdout, "server (HTTP)", summary);
  const int64_t requested = loadgen::totals_of(items).output_tokens;
  if (summary.output_tokens != requested)
    std::fprintf(stderr, "kvserve: warning: the server generated %lld output tokens where %lld were requested "
                 "(it may ignore ignore_eos / min_tokens and stop at end-of-sequence)\n",
                 static_cast<long long>(summary.output_tokens), static_cast<long long>(requested));
  return 0;
}

}  // namespace

int run_serving_bench(const BenchOptions& o) {
  const loadgen::WorkloadOptions w = workload_options(o);
  return o.url.empty() ? run_engine_bench(o, w) : run_remote_bench(o, w);
}

}  // namespace kvserve::cli
