#pragma once
// --rope-scaling, --rope-scale, --yarn-orig-ctx on the commands that run a
// model (run, serve, perplexity), as llama.cpp names them: replace the file's
// RoPE scaling, e.g. YaRN x4 for a Qwen2.5 file whose metadata stops at its
// trained 32K context (ModelConfig::override_rope_scaling).
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "core/error.h"
#include "model/model.h"

namespace kvserve::cli {

struct RopeFlags {
  std::string type;  // empty: the file's scaling
  double factor = 0;
  int64_t original_context = 0;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--rope-scaling", type, "RoPE scaling instead of the file's: none, linear or yarn")
        ->check(CLI::IsMember({"none", "linear", "yarn"}));
    cmd->add_option("--rope-scale", factor, "With --rope-scaling: the context scale factor (e.g. 4)");
    cmd->add_option("--yarn-orig-ctx", original_context,
                    "With --rope-scaling yarn: the model's trained context (default: the file's)");
  }

  // The model's load options with the override, when one was given.
  ModelLoadOptions apply(ModelLoadOptions options) const {
    if (type.empty()) {
      if (factor != 0 || original_context != 0) throw kvserve::Error("--rope-scale and --yarn-orig-ctx need --rope-scaling");
      return options;
    }
    options.rope_scaling = RopeScalingOverride{type, factor, original_context};
    return options;
  }
};

}  // namespace kvserve::cli
