// `kvserve synth --preset NAME --type T -o OUT.gguf [--seed S] [--layers N] [--context N]`:
// writes a random-weight model with a well-known model's exact shapes.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "model/synth.h"

namespace kvserve::cli {
namespace {

struct SynthArgs {
  std::string preset;
  std::string type = "q8_0";
  std::string output;
  uint64_t seed = 1;
  int layers = 0;
  int context = 0;
  bool list = false;
};

void run_synth(const SynthArgs& args) {
  if (args.list || args.preset.empty()) {
    std::printf("%-18s %-6s %5s %6s %5s %4s %6s %7s\n", "preset", "arch", "dim", "layers", "heads", "kv", "ffn",
                "vocab");
    for (const SynthPreset& p : synth_presets())
      std::printf("%-18s %-6s %5d %6d %5d %4d %6d %7d\n", p.name.c_str(), p.arch.c_str(), p.dim, p.n_layers,
                  p.n_heads, p.n_kv_heads, p.ffn_dim, p.vocab_size);
    return;
  }
  if (args.output.empty()) throw CLI::RequiredError("-o");
  SynthOptions options;
  options.preset = args.preset;
  options.type = parse_dtype(args.type);
  options.output_path = args.output;
  options.seed = args.seed;
  options.layers = args.layers;
  options.context = args.context;
  synthesize_model(options);
  std::printf("wrote %s (%s, %s, seed %llu)\n", args.output.c_str(), args.preset.c_str(), args.type.c_str(),
              static_cast<unsigned long long>(args.seed));
}

}  // namespace

void register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a random-weight GGUF model with a well-known model's shapes");
  auto args = std::make_shared<SynthArgs>();
  cmd->add_option("--preset", args->preset, "model shape (see --list)");
  cmd->add_option("--type", args->type, "matrix type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}));
  cmd->add_option("-o,--output", args->output, "GGUF file to write");
  cmd->add_option("--seed", args->seed, "random seed (same seed, same bytes)");
  cmd->add_option("--layers", args->layers, "override the preset's layer count")->check(CLI::Range(1, 1024));
  cmd->add_option("--context", args->context, "override the preset's context length")->check(CLI::Range(1, 1 << 24));
  cmd->add_flag("--list", args->list, "list the presets");
  cmd->callback([args] { run_synth(*args); });
}

}  // namespace kvserve::cli
