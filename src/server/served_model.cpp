#include "server/served_model.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "server/reasoning.h"
#include "speculation/request_speculation.h"

namespace kvserve::server {

ModelSetup model_setup(const std::string& id, const ModelOptions& o, const EngineOptions& engine,
                       const SpeculationSettings& speculation) {
  ModelSetup setup{engine, speculation, o.draft.value_or("")};
  try {
    if (o.context) setup.engine.max_context = *o.context;
    if (o.kv_type) setup.engine.kv_type = parse_kv_type(*o.kv_type, "kv-type");
    if (o.kv_mem_mib) setup.engine.kv_memory_bytes = *o.kv_mem_mib << 20;
    if (o.threads) setup.engine.threads = *o.threads;
    if (o.spec) setup.speculation.mode = parse_speculative_mode(*o.spec);
    if (o.draft_k) setup.speculation.draft_k = *o.draft_k;
    setup.engine.draft_model = nullptr;  // ServedModel::load loads draft_path's
    setup.engine.measure_step_cost = setup.speculation.mode == SpeculativeMode::kAuto;
    validate_speculation(setup.speculation, !setup.draft_path.empty());
  } catch (const Error& e) {
    throw Error("model \"" + id + "\": " + e.what());
  }
  return setup;
}

ServedModel::ServedModel(std::string id_in, Engine& engine_in, const Model& model_in, const Tokenizer& tokenizer_in,
                         ChatTemplate chat_template_in, const ServedModelSettings& settings)
    : id(std::move(id_in)),
      engine(engine_in),
      model(model_in),
      tokenizer(tokenizer_in),
      chat_template(std::move(chat_template_in)),
      context(std::min(engine.options().max_context, model.config().context_length)),
      parser(tokenizer, chat_template, context, settings.speculation, engine.options().draft_model != nullptr,
             engine.request_limits()),
      ollama(model, id, context, chat_template),
      constraints(tokenizer, model.config().vocab_size, settings.constraints) {
  if (std::optional<ReasoningSyntax> syntax = reasoning_syntax_for(chat_template.source()))
    reasoning_tags = ReasoningTags::of(tokenizer, syntax->start, syntax->end);
}

// The references are taken before owned moves in: the objects stay where they are.
ServedModel::ServedModel(std::string id_in, Owned owned, ChatTemplate chat_template_in,
                         const ServedModelSettings& settings)
    : ServedModel(std::move(id_in), *owned.engine, *owned.model, *owned.tokenizer, std::move(chat_template_in),
                  settings) {
  owned_ = std::move(owned);
}

std::unique_ptr<ServedModel> ServedModel::load(std::string id, const std::string& path,
                                               const ModelLoadOptions& load_options, EngineOptions engine_options,
                                               const ServedModelSettings& settings, const std::string& draft_path,
                                               const ModelLoadOptions& draft_load_options) {
  Owned owned;
  owned.model = Model::load(path, load_options);
  if (!draft_path.empty()) {
    owned.draft = Model::load(draft_path, draft_load_options);
    engine_options.draft_model = owned.draft.get();
  }
  owned.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(owned.model->file()));
  ChatTemplate chat_template = ChatTemplate::for_model(owned.model->file());
  owned.engine = std::make_unique<Engine>(*owned.model, *owned.tokenizer, engine_options);
  return std::unique_ptr<ServedModel>(new ServedModel(std::move(id), std::move(owned), std::move(chat_template), settings));
}

ModelMemory ServedModel::memory() const {
  const Model* draft = engine.options().draft_model;
  ModelMemory m;
  m.weights = static_cast<int64_t>(model.resident_weight_bytes() + (draft ? draft->resident_weight_bytes() : 0));
  m.kv = planned_kv_pool_bytes(model.config(), engine.options(), draft ? &draft->config() : nullptr);
  return m;
}

ServedModel::~ServedModel() {
  if (owned_.engine) owned_.engine->shutdown(false);
}

}  // namespace kvserve::server
