#pragma once
// The served model as Ollama's API describes models: its name ("smollm2:latest"
// style), GET /api/tags' entry, POST /api/show's details and model_info,
// GET /api/ps' entry, and the check that a request names it.
#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "tokenizer/chat_template.h"

namespace kvserve::server {

// The Ollama version whose API the endpoints follow (GET /api/version):
// thinking levels, streamed tool calls, structured outputs.
inline constexpr const char* kOllamaApiVersion = "0.11.0";

class OllamaModelCard {
 public:
  // model_id: the id /v1/models reports (the file's stem, or --alias);
  // context: the tokens a sequence may hold on this server.
  OllamaModelCard(const Model& model, const std::string& model_id, int64_t context, const ChatTemplate& chat_template);

  // model_id with Ollama's default tag (":latest") unless it has a tag.
  const std::string& name() const { return name_; }
  // Throws ApiError 404 `model "x" not found` (naming the served one) unless
  // `requested` is empty (the served model), the id or the name.
  void check_requested(const std::string& requested) const;

  nlohmann::json tags() const;  // {"models": [entry]}
  nlohmann::json show() const;  // details, model_info, template, parameters, capabilities
  // {"models": [entry with expires_at, size_vram, context_length]}: the model
  // stays loaded for the server's life, so it never expires.
  nlohmann::json ps() const;

 private:
  nlohmann::json entry() const;  // name, model, modified_at, size, digest, details

  std::string model_id_;
  std::string name_;
  int64_t file_bytes_;
  int64_t resident_bytes_;
  std::string modified_at_;
  std::string digest_;
  nlohmann::json details_;
  nlohmann::json model_info_;
  std::string template_source_;
  nlohmann::json capabilities_;
  int64_t context_;
};

// GET /api/tags' entry of a model not loaded (many models: docs/server.md): name, file size and time, digest, no details.
nlohmann::json ollama_unloaded_entry(const std::string& model_id, const std::string& path);

// Ollama's "8.0B" / "134.52M" for a parameter count (its format.HumanNumber).
std::string ollama_parameter_size(uint64_t parameters);

// llama.cpp's name of a general.file_type ("Q4_K_M", "Q8_0", "F16"), or "unknown".
std::string ollama_quantization_level(uint64_t file_type);

}  // namespace kvserve::server
