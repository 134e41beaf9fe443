// `kvserve quantize IN.gguf OUT.gguf TYPE`: re-encode a model's weight matrices.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "model/quantize_model.h"

namespace kvserve::cli {
namespace {

struct QuantizeArgs {
  std::string input, output, type;
};

void quantize(const QuantizeArgs& a) {
  const QuantizeRecipe recipe = parse_quantize_recipe(a.type);
  const QuantizeReport r = quantize_model(a.input, a.output, recipe);
  std::fprintf(stderr, "wrote %s: %d matrices re-encoded (%s), %zu matrices kept; %.1f MiB -> %.1f MiB\n",
               a.output.c_str(), r.converted, recipe.name.c_str(), r.kept.size(), r.bytes_in / 1048576.0,
               r.bytes_out / 1048576.0);
  for (const std::string& name : r.kept) std::fprintf(stderr, "  kept: %s\n", name.c_str());
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand("quantize", "Re-encode a model's weight matrices (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q4_k, q5_k, q6_k, "
                                   "and the mixes q4_k_m, q5_k_m)");
  cmd->add_option("input", a->input, "Input GGUF model")->required();
  cmd->add_option("output", a->output, "Output GGUF file")->required();
  cmd->add_option("type", a->type, "Target: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q4_k, q5_k, q6_k, q4_k_m or q5_k_m (llama.cpp's mixes: "
                                     "Q6_K for output and some attn_v / ffn_down)")->required();
  cmd->callback([a] { quantize(*a); });
}

}  // namespace kvserve::cli
