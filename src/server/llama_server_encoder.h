#pragma once
// llama-server's own (non-OpenAI) answer shape, for /infill: a whole answer
// {"content", "stop": true, "stop_type", "stopping_word", "tokens_predicted",
// "tokens_evaluated", ...}, or a stream of `data:` chunks {"content": piece,
// "stop": false} ending with the whole answer's fields and "stop": true (no
// [DONE], as llama-server's own endpoints send none).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/response_encoder.h"

namespace kvserve::server {

class LlamaServerEncoder : public ResponseEncoder {
 public:
  explicit LlamaServerEncoder(std::string model_id) : model_(std::move(model_id)) {}

  nlohmann::json whole(const std::vector<ChoiceResult>& choices) override;
  std::string stream_event(const ChoiceEvent& event) override;
  std::string stream_end() override { return ""; }

 private:
  nlohmann::json final_fields(const std::string& content, const std::string& finish_reason,
                              const std::string& stop_sequence, int64_t prompt_tokens, int64_t completion_tokens,
                              int64_t cached_tokens) const;

  std::string model_;
};

}  // namespace kvserve::server
