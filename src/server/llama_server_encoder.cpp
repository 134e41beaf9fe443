#include "server/llama_server_encoder.h"

namespace kvserve::server {

using json = nlohmann::json;

json LlamaServerEncoder::final_fields(const std::string& content, const std::string& finish_reason,
                                      const std::string& stop_sequence, int64_t prompt_tokens,
                                      int64_t completion_tokens, int64_t cached_tokens) const {
  const std::string stop_type = finish_reason == "length" ? "limit" : stop_sequence.empty() ? "eos" : "word";
  return {{"index", 0},
          {"content", content},
          {"tokens", json::array()},
          {"id_slot", 0},
          {"stop", true},
          {"model", model_},
          {"tokens_predicted", completion_tokens},
          {"tokens_evaluated", prompt_tokens},
          {"tokens_cached", cached_tokens},
          {"truncated", false},
          {"stop_type", stop_type},
          {"stopping_word", stop_sequence}};
}

json LlamaServerEncoder::whole(const std::vector<ChoiceResult>& choices) {
  const ChoiceResult& r = choices.at(0);
  return final_fields(r.text, r.finish_reason, r.stop_sequence, r.prompt_tokens, r.completion_tokens, r.cached_tokens);
}

std::string LlamaServerEncoder::stream_event(const ChoiceEvent& event) {
  const GenerationEvent& e = event.event;
  if (e.finished && (e.finish_reason == "error" || e.finish_reason == "cancelled")) {
    const bool cancelled = e.finish_reason == "cancelled";
    return sse_event({{"error", {{"code", cancelled ? 503 : 500}, {"type", "server_error"},
                                 {"message", cancelled ? "the request was cancelled (the server is shutting down)" : e.error}}}});
  }
  if (!e.finished)
    return sse_event({{"index", 0}, {"content", e.text}, {"tokens", json::array()}, {"stop", false}, {"id_slot", 0},
                      {"tokens_predicted", e.completion_tokens}, {"tokens_evaluated", e.prompt_tokens}});
  // The last chunk: its text (if any), then the whole answer's fields.
  std::string out;
  if (!e.text.empty())
    out = sse_event({{"index", 0}, {"content", e.text}, {"tokens", json::array()}, {"stop", false}, {"id_slot", 0},
                     {"tokens_predicted", e.completion_tokens}, {"tokens_evaluated", e.prompt_tokens}});
  return out + sse_event(final_fields("", e.finish_reason, e.stop_sequence, e.prompt_tokens, e.completion_tokens,
                                      e.cached_tokens));
}

}  // namespace kvserve::server
