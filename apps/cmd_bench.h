#pragma once
// `kvserve bench` has several modes, each in its own file:
//   default     prompt processing / text generation table (cmd_bench_llama.cpp)
//   --spec      speculative decoding modes (cmd_bench_spec.cpp)
//   --serving   serving workload, in process or against a server (cmd_bench_serving.cpp, src/loadgen/)
#include <cstdint>
#include <string>
#include <vector>

#include "apps/draft_flags.h"
#include "apps/pipeline.h"

namespace kvserve::cli {

struct BenchOptions {
  std::vector<std::string> models = {"models/smollm2-135m-instruct-q4_1.gguf"};
  std::vector<int64_t> n_prompt = {512};   // -p
  std::vector<int64_t> n_gen = {128};      // -n
  std::vector<int64_t> n_depth = {0};      // -d: tokens of context before each test
  int repetitions = 5;                     // -r
  std::vector<int> threads = {0};          // -t (0: all cores)
  std::string output = "md";               // md | json | csv
  bool membw = false;                      // measure memory read bandwidth only
  bool spec = false;
  bool serving = false;
  // --spec
  std::string draft;                       // draft model path ("" : a truncated copy of the target)
  std::vector<int> draft_k = {1, 2, 4, 6, 8};
  int draft_layers = 6;                    // layers of the truncated copy when draft is ""
  cli::DraftFlags draft_flags;             // --draft-vocab, --draft-activations
  std::vector<std::string> spec_workloads; // --workload: story, copy, code (none: all)
  bool pass_only = false;                  // only the one-pass-over-n-tokens table (target, n = 1..9)
  // --serving
  std::string url;                         // drive a running server instead of the in-process engine
  std::string model_name;                  // with --url: the model name sent ("" : ask GET /v1/models)
  std::string api_key;                     // with --url: sent as a Bearer token
  double timeout_s = 300;                  // with --url: connect / idle-read timeout in seconds
  bool model_given = false;                // -m was passed (with --url: count prompt tokens with its tokenizer)
  int requests = 32;
  int concurrency = 16;
  double request_rate = 0;                 // Poisson arrivals per second (0: all at once)
  int64_t shared_prefix = 0;               // tokens of system prompt shared by every request
  int prefix_groups = 1;                   // distinct shared prefixes, each request draws one
  std::string schema;                      // a JSON schema file every request follows ("builtin": an order list)
  std::string kv_type = "f16";             // KV pool element type
  int64_t kv_mem_mib = 0;                  // KV pool budget (0: room for every running sequence at its longest)
  uint64_t seed = 1;
  PipelineFlags pipeline;                  // --pipeline-parallel: the in-process --serving engine over mpirun's ranks
};

int run_llama_bench(const BenchOptions& options);
int run_spec_bench(const BenchOptions& options);
int run_serving_bench(const BenchOptions& options);

}  // namespace kvserve::cli
