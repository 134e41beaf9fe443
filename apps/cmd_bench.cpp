// `kvserve bench`: flag parsing and dispatch to the bench modes (apps/cmd_bench.h).
#include "apps/cmd_bench.h"
#include "apps/activations_flag.h"
#include "apps/commands.h"
#include "core/error.h"

namespace kvserve::cli {

void register_bench(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Benchmark prompt processing and generation (like llama-bench)");
  add_activations_flag(cmd);
  auto* model = cmd->add_option("-m,--model", opt->models, "GGUF model file(s)")->capture_default_str();
  cmd->add_option("-p,--n-prompt", opt->n_prompt, "Prompt lengths to test")->capture_default_str();
  cmd->add_option("-n,--n-gen", opt->n_gen, "Generation lengths to test")->capture_default_str();
  cmd->add_option("-d,--n-depth", opt->n_depth,
                  "Tokens of context before each test (llama-bench's -d; their prefill is not timed)")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", opt->repetitions, "Repetitions of each test")->capture_default_str();
  cmd->add_option("-t,--threads", opt->threads, "Thread counts to test (0: all cores)")->capture_default_str();
  cmd->add_option("-o,--output", opt->output, "md, json or csv")
      ->check(CLI::IsMember({"md", "json", "csv"}))
      ->capture_default_str();
  cmd->add_flag("--membw", opt->membw, "Measure the machine's memory read bandwidth");
  cmd->add_flag("--spec", opt->spec, "Benchmark speculative decoding (target only, draft model, n-gram)");
  cmd->add_option("--draft", opt->draft, "Draft model for --spec (default: a truncated copy of the target)");
  cmd->add_option("--draft-layers", opt->draft_layers, "With --spec and no --draft: layers of the target used as the draft")
      ->capture_default_str();
  add_draft_flags(cmd, opt->draft_flags);
  cmd->add_option("--draft-k", opt->draft_k, "Draft lengths to test with --spec")->capture_default_str();
  cmd->add_option("--workload", opt->spec_workloads, "With --spec: workloads to run (story, copy, code; default all)");
  cmd->add_flag("--pass-only", opt->pass_only,
                "With --spec: only time one target pass over n = 1..9 tokens (and t(n) / t(1))");
  cmd->add_flag("--serving", opt->serving, "Benchmark a serving workload (continuous batching)");
  cmd->add_option("--url", opt->url, "With --serving: drive a running OpenAI-compatible server (http://host:port)");
  cmd->add_option("--model-name", opt->model_name, "With --url: the model name to send (default: the first of /v1/models)");
  cmd->add_option("--api-key", opt->api_key, "With --url: the server's API key (Bearer)");
  cmd->add_option("--timeout", opt->timeout_s, "With --url: seconds to wait to connect or for any byte of an answer")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  cmd->add_option("--requests", opt->requests, "With --serving: requests to send")->capture_default_str();
  cmd->add_option("--concurrency", opt->concurrency, "With --serving: requests in flight")->capture_default_str();
  cmd->add_option("--request-rate", opt->request_rate, "With --serving: Poisson arrival rate (0: all at once)")
      ->capture_default_str();
  cmd->add_option("--shared-prefix", opt->shared_prefix, "With --serving: shared system-prompt tokens")
      ->capture_default_str();
  cmd->add_option("--prefix-groups", opt->prefix_groups,
                  "With --serving: distinct shared system prompts, each request draws one at random")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--schema", opt->schema,
                  "With --serving (in-process): a JSON schema file every request's output follows, compared with "
                  "free output (\"builtin\": a list of order lines)");
  cmd->add_option("--seed", opt->seed, "Workload seed")->capture_default_str();
  cmd->add_option("--kv-type", opt->kv_type, "KV cache element type (f32, f16, bf16, q8_0, fp8, q4_0)")
      ->capture_default_str();
  cmd->add_option("--kv-mem", opt->kv_mem_mib, "With --serving: KV pool MiB (0: room for every running sequence)")
      ->capture_default_str();
  add_pipeline_flags(cmd, opt->pipeline);
  cmd->callback([opt, model] {
    opt->model_given = model->count() > 0;
    if (opt->pipeline.ranks > 1 && (!opt->serving || !opt->url.empty()))
      throw Error("--pipeline-parallel runs the in-process engine of bench --serving (without --url)");
    int rc = 0;
    if (opt->spec) rc = run_spec_bench(*opt);
    else if (opt->serving) rc = run_serving_bench(*opt);
    else rc = run_llama_bench(*opt);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvserve::cli
