#include "server/served_model.h"

#include <algorithm>
#include <utility>

#include "server/reasoning.h"

namespace kvserve::server {

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

ServedModel::ServedModel(std::string id_in, Owned owned, ChatTemplate chat_template_in,
                         const ServedModelSettings& settings)
    : owned_(std::move(owned)),
      id(std::move(id_in)),
      engine(*owned_.engine),
      model(*owned_.model),
      tokenizer(*owned_.tokenizer),
      chat_template(std::move(chat_template_in)),
      context(std::min(engine.options().max_context, model.config().context_length)),
      parser(tokenizer, chat_template, context, settings.speculation, engine.options().draft_model != nullptr,
             engine.request_limits()),
      ollama(model, id, context, chat_template),
      constraints(tokenizer, model.config().vocab_size, settings.constraints) {
  if (std::optional<ReasoningSyntax> syntax = reasoning_syntax_for(chat_template.source()))
    reasoning_tags = ReasoningTags::of(tokenizer, syntax->start, syntax->end);
}

std::unique_ptr<ServedModel> ServedModel::load(std::string id, const std::string& path,
                                               const ModelLoadOptions& load_options, const EngineOptions& engine_options,
                                               const ServedModelSettings& settings) {
  Owned owned;
  owned.model = Model::load(path, load_options);
  owned.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(owned.model->file()));
  ChatTemplate chat_template = ChatTemplate::for_model(owned.model->file());
  owned.engine = std::make_unique<Engine>(*owned.model, *owned.tokenizer, engine_options);
  return std::unique_ptr<ServedModel>(new ServedModel(std::move(id), std::move(owned), std::move(chat_template), settings));
}

ServedModel::~ServedModel() {
  if (owned_.engine) owned_.engine->shutdown(false);
}

}  // namespace kvserve::server
