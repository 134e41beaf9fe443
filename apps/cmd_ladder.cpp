// `kvserve ladder`: the naive-to-tuned ladder (src/ladder/ladder.h) on one
// model and workload: a markdown table (or JSON) and optionally a bar chart.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "ladder/ladder.h"

namespace kvserve::cli {
namespace {

struct LadderArgs {
  LadderOptions options;
  std::string plot;
  bool json = false;
};

void ladder(LadderArgs& a) {
  a.options.progress = [](const std::string& line) { std::fprintf(stderr, "ladder: %s\n", line.c_str()); };
  const LadderResult result = run_ladder(a.options);
  if (a.json) std::printf("%s\n", ladder_json(result).dump(2).c_str());
  else
    std::printf("model %s (%s) | %lld requests, %lld prompt tokens each (%lld shared), %lld greedy tokens each\n\n%s",
                result.model_name.c_str(), result.model_path.c_str(), static_cast<long long>(result.requests),
                static_cast<long long>(result.prompt_len), static_cast<long long>(result.shared_prefix),
                static_cast<long long>(result.gen_len), format_ladder_markdown(result).c_str());
  if (!a.plot.empty()) {
    write_png(a.plot, plot_ladder(result));
    std::fprintf(stderr, "ladder: wrote %s\n", a.plot.c_str());
  }
}

}  // namespace

void register_ladder(CLI::App& app) {
  auto a = std::make_shared<LadderArgs>();
  LadderOptions& o = a->options;
  o.model_path = "models/smollm2-135m-instruct-q4_1.gguf";
  auto* cmd = app.add_subcommand("ladder", "Measure each optimization's gain, naive to tuned, on one workload");
  cmd->add_option("-m,--model", o.model_path, "GGUF model")->capture_default_str();
  cmd->add_option("--requests", o.requests, "Requests in the workload")->capture_default_str();
  cmd->add_option("--prompt-len", o.prompt_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--gen-len", o.gen_len, "Greedy tokens generated per request")->capture_default_str();
  cmd->add_option("--shared-prefix", o.shared_prefix, "Prompt tokens every request shares (-1: half the prompt)")
      ->capture_default_str();
  cmd->add_option("--rung-budget", o.rung_budget_s, "Seconds before a slow sequential rung stops and is scaled")
      ->capture_default_str();
  cmd->add_option("--draft-k", o.draft_k, "rung 7: drafts per speculative round at most (auto speculation chooses k, 0 included)")->capture_default_str();
  cmd->add_option("-t,--threads", o.threads, "Threads for rungs 4-7 (0: all cores)")->capture_default_str();
  cmd->add_option("--rounds", o.rounds,
                  "Runs of each engine rung (5-7), in turn; the fastest is kept (a shared host moves one run +-10%)")
      ->check(CLI::Range(1, 20))
      ->capture_default_str();
  cmd->add_option("--temp-dir", o.temp_dir, "Where the f32 / q8_0 model copies go (default: the temp dir)");
  cmd->add_flag("--long-context", o.long_context,
                "Only rungs 2 and 3 (materializing vs flash attention) with rung 4's weights, kernels and threads: "
                "for a long --prompt-len, where attention's share shows");
  cmd->add_option("--plot", a->plot, "Write a PNG bar chart here");
  cmd->add_flag("--json", a->json, "Print the raw numbers as JSON instead of the table");
  cmd->callback([a] { ladder(*a); });
}

}  // namespace kvserve::cli
