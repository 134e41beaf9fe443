#pragma once
// --activations on the commands that run a model (run, serve, bench,
// perplexity): the process default for the activations of quantized matmuls,
// as KVSERVE_ACTIVATIONS sets it (the flag wins). A draft model keeps its own
// --draft-activations.
#include <CLI/CLI.hpp>

#include <string>

#include "kernels/dispatch.h"

namespace kvserve::cli {

inline void add_activations_flag(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
         "--activations",
         [](const std::string& name) { set_activation_precision(parse_activation_precision(name)); },
         "Activations of quantized matmuls: q8 (the default: 8-bit, llama.cpp's scheme, batch-invariant "
         "repacked kernels, ~1e-2 relative error per matmul) or f32 (exact, slower); overrides KVSERVE_ACTIVATIONS")
      ->check(CLI::IsMember({"f32", "q8"}));
}

}  // namespace kvserve::cli
