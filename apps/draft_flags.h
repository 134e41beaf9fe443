#pragma once
// The draft model's load flags, shared by run, serve and bench --spec: how
// much of its output head to compute and which activations its matmuls use.
// Neither changes the output (the target verifies every token), only speed
// and acceptance.
#include <CLI/CLI.hpp>

#include <string>

#include "model/model.h"

namespace kvserve::cli {

struct DraftFlags {
  int64_t vocab = 0;              // logits only for ids below this (0: all)
  std::string activations = "q8"; // f32 | q8

  // Load options of a draft made of the first max_layers layers (0: all).
  ModelLoadOptions load_options(int64_t max_layers = 0) const {
    return {.max_layers = max_layers,
            .max_output_rows = vocab,
            .activations = parse_activation_precision(activations)};
  }
};

inline void add_draft_flags(CLI::App* cmd, DraftFlags& flags) {
  cmd->add_option("--draft-vocab", flags.vocab,
                  "The draft computes logits only for token ids below this (a cheaper draft head: byte-level BPE ids "
                  "follow merge order, so low ids are the frequent tokens); 0: all")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--draft-activations", flags.activations,
                  "The draft's matmul activations: q8 (8-bit, faster) or f32 (exact); the target keeps "
                  "KVSERVE_ACTIVATIONS")
      ->check(CLI::IsMember({"f32", "q8"}))
      ->capture_default_str();
}

}  // namespace kvserve::cli
