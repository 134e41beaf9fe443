#pragma once
// The presets file of a many-model server (serve --models-preset FILE;
// docs/server.md, "Presets file"): llama-server's router INI. Each [section]
// is a model id (the alias /v1/models and /api/tags list) with options named
// as serve's flags; [*] gives every model's defaults.
//
//   [*]
//   ctx-size = 2048
//   [chat]
//   model = smollm2-135m-instruct-q4_1.gguf   # relative to the file's folder
//   kv-type = q8_0
//
// A section without `model` sets the options of a model -m or --models-dir
// already serves under that id. Plain data, no model is opened here.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvserve::server {

// A model's options that differ from the server's flags (unset: the flag's value).
struct ModelOptions {
  std::optional<int64_t> context;      // ctx-size, c
  std::optional<std::string> kv_type;  // kv-type (a name parse_kv_type takes)
  std::optional<int64_t> kv_mem_mib;   // kv-mem
  std::optional<int> threads;          // threads, t
  std::optional<std::string> draft;    // draft: a draft model file (speculative mode "draft")
  std::optional<std::string> spec;     // spec: none | ngram | draft | auto
  std::optional<int64_t> draft_k;      // draft-k
  // These, then `fallback` where these are unset.
  ModelOptions or_else(const ModelOptions& fallback) const;
};

struct ModelPreset {
  std::string id;
  std::string path;  // empty: options for a model served under this id by -m or --models-dir
  ModelOptions options;
  int line = 0;      // of its [section], for messages
};

struct ModelPresets {
  ModelOptions defaults;  // [*]
  std::vector<ModelPreset> models;  // in the file's order
};

// Parses the text of a presets file; relative `model` paths are resolved against `folder`. Throws kvserve::Error
// "NAME:LINE: ..." naming the key or section for anything it does not take; never another exception.
ModelPresets parse_model_presets(const std::string& text, const std::string& name, const std::string& folder);
// Reads and parses the file (at most 1 MiB); throws kvserve::Error.
ModelPresets load_model_presets(const std::string& path);

}  // namespace kvserve::server
