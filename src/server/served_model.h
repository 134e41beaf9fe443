#pragma once
// One model as the server serves it: its engine, model and tokenizer, and what
// the request path derives from them (parser, constraint compiler, Ollama card,
// reasoning tags). Either over objects the caller owns (a single -m server) or
// owning them all (loaded by the ModelRouter; destroying it frees the engine's
// KV pool, the repacked weights and the file mapping).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "grammar/constraint_compiler.h"
#include "grammar/reasoning_gate.h"
#include "model/model.h"
#include "server/model_memory.h"
#include "server/model_presets.h"
#include "server/ollama_models.h"
#include "server/request_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::server {

struct ServedModelSettings {
  SpeculationSettings speculation;  // the server's default for requests without "speculative"
  ConstraintLimits constraints;
};

// How one model of a many-model server is loaded: the server's options with its preset's over them.
struct ModelSetup {
  EngineOptions engine;
  SpeculationSettings speculation;  // its requests' default
  std::string draft_path;           // empty: no draft model
};
// Throws kvserve::Error naming the model for a KV type or speculation mode it cannot run (spec = draft without
// a draft model). Reads no file.
ModelSetup model_setup(const std::string& id, const ModelOptions& options, const EngineOptions& engine,
                       const SpeculationSettings& speculation);

class ServedModel {
 public:
  // Over objects the caller owns, which must outlive this.
  ServedModel(std::string id, Engine& engine, const Model& model, const Tokenizer& tokenizer, ChatTemplate chat_template,
              const ServedModelSettings& settings);
  // Loads the file: the model, its tokenizer and chat template, and an engine with these options.
  // Throws (kvserve::Error and others) when the file cannot be loaded.
  // draft_path (not empty): a draft model loaded with draft_load_options for the engine's draft mode (it
  // replaces engine_options.draft_model).
  static std::unique_ptr<ServedModel> load(std::string id, const std::string& path, const ModelLoadOptions& load_options,
                                           EngineOptions engine_options, const ServedModelSettings& settings,
                                           const std::string& draft_path = "",
                                           const ModelLoadOptions& draft_load_options = {});
  ~ServedModel();  // an owned engine is shut down first (its thread joined, its requests cancelled)
  ServedModel(const ServedModel&) = delete;
  ServedModel& operator=(const ServedModel&) = delete;
  // What it holds: its (and its draft model's) resident weight bytes and its engine's K/V pools.
  ModelMemory memory() const;

 private:
  struct Owned {
    std::unique_ptr<Model> model;
    std::unique_ptr<Model> draft;  // null: none
    std::unique_ptr<Tokenizer> tokenizer;
    std::unique_ptr<Engine> engine;
  };
  ServedModel(std::string id, Owned owned, ChatTemplate chat_template, const ServedModelSettings& settings);
  Owned owned_;  // first: destroyed last, after everything below that refers to it

 public:
  const std::string id;  // the id /v1/models reports and responses echo
  Engine& engine;
  const Model& model;
  const Tokenizer& tokenizer;
  const ChatTemplate chat_template;
  const int64_t context;  // the tokens a sequence may hold
  RequestParser parser;
  OllamaModelCard ollama;
  ConstraintCompiler constraints;
  // The template's reasoning tags as tokens (nullopt: the model does not reason), for the reasoning gate.
  std::optional<ReasoningTags> reasoning_tags;
};

}  // namespace kvserve::server
