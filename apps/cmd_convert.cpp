// `kvserve convert llama2c IN.bin OUT.gguf [--vocab tokenizer.bin] [--type T]`:
// imports a llama2.c checkpoint as a GGUF "llama" model.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "core/error.h"
#include "model/llama2c.h"

namespace kvserve::cli {
namespace {

struct ConvertLlama2cArgs {
  std::string checkpoint;
  std::string output;
  std::string vocab;
  std::string type = "f32";
};

void run_convert_llama2c(const ConvertLlama2cArgs& args) {
  Llama2cOptions options;
  options.checkpoint_path = args.checkpoint;
  options.output_path = args.output;
  options.tokenizer_path = args.vocab;
  options.type = parse_dtype(args.type);
  const Llama2cReport report = convert_llama2c(options);
  const Llama2cConfig& c = report.config;
  std::printf("llama2.c v%d checkpoint: dim %d, hidden %d, %d layers, %d heads, %d kv heads, vocab %d, seq %d, %s\n",
              c.version, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
              c.shared_classifier ? "shared classifier" : "separate classifier");
  for (const std::string& name : report.kept_f32)
    std::printf("  %s kept as f32: its rows are not a whole number of %s blocks\n", name.c_str(), args.type.c_str());
  if (report.placeholder_vocab)
    std::printf("warning: no --vocab given; wrote a placeholder byte vocabulary (text will not decode properly)\n");
  std::printf("wrote %s: %zu tensors\n", args.output.c_str(), report.tensor_count);
}

}  // namespace

void register_convert(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Convert a model from another format to GGUF");
  cmd->require_subcommand(1);
  auto* llama2c = cmd->add_subcommand("llama2c", "Import a llama2.c checkpoint (versions 0, 1 and 2)");
  auto args = std::make_shared<ConvertLlama2cArgs>();
  llama2c->add_option("checkpoint", args->checkpoint, "llama2.c .bin checkpoint")->required();
  llama2c->add_option("output", args->output, "GGUF file to write")->required();
  llama2c->add_option("--vocab", args->vocab, "llama2.c tokenizer.bin (without it: a placeholder vocabulary)");
  llama2c->add_option("--type", args->type, "matrix type: f32, f16, bf16, q8_0, q4_0, q4_1")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"}));
  llama2c->callback([args] { run_convert_llama2c(*args); });
}

}  // namespace kvserve::cli
