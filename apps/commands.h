#pragma once
// Each `kvserve` subcommand lives in its own cmd_*.cpp and registers itself here.
#include <CLI/CLI.hpp>

namespace kvserve::cli {

void register_info(CLI::App& app);
void register_run(CLI::App& app);
void register_convert(CLI::App& app);
void register_synth(CLI::App& app);
void register_kv_size(CLI::App& app);
void register_bench(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_serve(CLI::App& app);
void register_quantize(CLI::App& app);
void register_ladder(CLI::App& app);

}  // namespace kvserve::cli
