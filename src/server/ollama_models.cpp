#include "server/ollama_models.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "server/api_error.h"
#include "server/chat_template_capabilities.h"
#include "server/rfc3339_time.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

// Strings in model_info longer than this (chat templates, licenses) are left out, as Ollama leaves out arrays.
constexpr size_t kMaxInfoStringBytes = 1024;

// A stable 64-hex-digit digest of the name and size (Ollama's is the file's
// sha256; hashing gigabytes at start-up would only delay the server).
std::string stable_digest(const std::string& name, int64_t size) {
  const std::string text = name + "\n" + std::to_string(size);
  std::string out;
  for (uint64_t lane = 0; lane < 4; ++lane) {
    uint64_t h = 14695981039346656037ull ^ (lane * 0x9e3779b97f4a7c15ull);  // FNV-1a, one lane per 16 digits
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    out += hex;
  }
  return out;
}

std::string modified_at(const std::string& path) {
  std::error_code error;
  const auto written = std::filesystem::last_write_time(path, error);
  if (error) return rfc3339_utc(std::chrono::system_clock::now());
  return rfc3339_utc(std::chrono::file_clock::to_sys(written));
}

uint64_t parameter_count(const GGUFFile& file) {
  if (const GGUFValue* given = file.find("general.parameter_count"); given && given->is_integer()) return given->u;
  uint64_t total = 0;
  for (const TensorView& t : file.tensors()) total += static_cast<uint64_t>(t.numel());
  return total;
}

bool is_signed(GGUFType type) {
  return type == GGUFType::I8 || type == GGUFType::I16 || type == GGUFType::I32 || type == GGUFType::I64;
}

// The file's scalar metadata, as Ollama's model_info lists it (arrays and long strings left out).
json scalar_metadata(const GGUFFile& file) {
  json out = json::object();
  for (const auto& [key, value] : file.metadata()) {
    if (value.type == GGUFType::ARRAY) continue;
    if (value.type == GGUFType::STRING) {
      if (value.str.size() <= kMaxInfoStringBytes) out[key] = value.str;
    } else if (value.type == GGUFType::BOOL) {
      out[key] = value.b;
    } else if (value.is_float()) {
      out[key] = value.f;
    } else if (value.is_integer()) {
      out[key] = is_signed(value.type) ? json(value.i) : json(value.u);
    }
  }
  return out;
}

json model_info_of(const Model& model, uint64_t parameters) {
  const ModelConfig& c = model.config();
  json info = scalar_metadata(model.file());
  const std::string& arch = c.arch;
  info["general.architecture"] = arch;
  info["general.parameter_count"] = parameters;
  // What the engine runs with, under llama.cpp's keys (the file may spell some of them otherwise).
  info[arch + ".context_length"] = c.file_context_length > 0 ? c.file_context_length : c.context_length;
  info[arch + ".embedding_length"] = c.dim;
  info[arch + ".block_count"] = c.n_layers;
  info[arch + ".feed_forward_length"] = c.ffn_dim;
  info[arch + ".attention.head_count"] = c.n_heads;
  info[arch + ".attention.head_count_kv"] = c.n_kv_heads;
  info[arch + ".vocab_size"] = c.vocab_size;
  return info;
}

json capabilities_of(const ChatTemplate& chat_template) {
  // Every template gets tools: those that know none are shown them in the system message (tool_conversation.h).
  json out = {"completion", "tools"};
  if (ChatTemplateCapabilities::of(chat_template).reasoning) out.push_back("thinking");
  return out;
}

}  // namespace

std::string ollama_parameter_size(uint64_t parameters) {
  auto scaled = [](double number, const char* unit, const char* fraction_format) {
    char text[32];
    if (number == std::floor(number)) std::snprintf(text, sizeof text, "%.0f%s", number, unit);
    else std::snprintf(text, sizeof text, fraction_format, number, unit);
    return std::string(text);
  };
  const auto n = static_cast<double>(parameters);
  if (n >= 1e9) return scaled(n / 1e9, "B", "%.1f%s");
  if (n >= 1e6) return scaled(n / 1e6, "M", "%.2f%s");
  if (n >= 1e3) return scaled(std::round(n / 1e3), "K", "%.0f%s");
  return std::to_string(parameters);
}

std::string ollama_quantization_level(uint64_t file_type) {
  static const char* const kNames[] = {
      "F32",     "F16",    "Q4_0",   "Q4_1",   "Q4_1_SOME_F16", "Q4_2",   "Q4_3",    "Q8_0",   "Q5_0",
      "Q5_1",    "Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L",        "Q4_K_S", "Q4_K_M",  "Q5_K_S", "Q5_K_M",
      "Q6_K",    "IQ2_XXS", "IQ2_XS", "Q2_K_S", "IQ3_XS",       "IQ3_XXS", "IQ1_S",  "IQ4_NL", "IQ3_S",
      "IQ3_M",   "IQ2_S",  "IQ2_M",  "IQ4_XS", "IQ1_M",         "BF16"};
  return file_type < std::size(kNames) ? kNames[file_type] : "unknown";
}

OllamaModelCard::OllamaModelCard(const Model& model, const std::string& model_id, int64_t context,
                                 const ChatTemplate& chat_template)
    : model_id_(model_id),
      name_(model_id.find(':') == std::string::npos ? model_id + ":latest" : model_id),
      file_bytes_(static_cast<int64_t>(model.file().file_size())),
      resident_bytes_(static_cast<int64_t>(model.resident_weight_bytes())),
      modified_at_(modified_at(model.file().path())),
      digest_(stable_digest(name_, file_bytes_)),
      template_source_(chat_template.source()),
      capabilities_(capabilities_of(chat_template)),
      context_(context) {
  const uint64_t parameters = parameter_count(model.file());
  const GGUFValue* file_type = model.file().find("general.file_type");
  const std::string& family = model.config().arch;
  details_ = {{"parent_model", ""},
              {"format", "gguf"},
              {"family", family},
              {"families", {family}},
              {"parameter_size", ollama_parameter_size(parameters)},
              {"quantization_level", file_type && file_type->is_integer() ? ollama_quantization_level(file_type->u)
                                                                          : "unknown"}};
  model_info_ = model_info_of(model, parameters);
}

void OllamaModelCard::check_requested(const std::string& requested) const {
  if (requested.empty() || requested == model_id_ || requested == name_) return;
  throw ApiError(404, "model \"" + requested + "\" not found; this server serves \"" + name_ + "\"", "model",
                 "not_found_error");
}

json OllamaModelCard::entry() const {
  return {{"name", name_}, {"model", name_}, {"modified_at", modified_at_},
          {"size", file_bytes_}, {"digest", digest_}, {"details", details_}};
}

json ollama_unloaded_entry(const std::string& model_id, const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  const int64_t bytes = error ? 0 : static_cast<int64_t>(size);
  const std::string name = model_id.find(':') == std::string::npos ? model_id + ":latest" : model_id;
  return {{"name", name}, {"model", name}, {"modified_at", modified_at(path)}, {"size", bytes},
          {"digest", stable_digest(name, bytes)}, {"details", {{"format", "gguf"}}}};
}

json OllamaModelCard::tags() const { return {{"models", json::array({entry()})}}; }

json OllamaModelCard::show() const {
  return {{"modelfile", "# kvserve serves this GGUF file as is\nFROM " + model_id_ + "\n"},
          {"parameters", ""},
          {"template", template_source_},
          {"details", details_},
          {"model_info", model_info_},
          {"capabilities", capabilities_},
          {"modified_at", modified_at_}};
}

json OllamaModelCard::ps() const {
  json model = entry();
  model.erase("modified_at");
  model["size"] = resident_bytes_;
  model["size_vram"] = 0;  // kvserve runs on the CPU
  // Never unloaded: the farthest time RFC 3339 writes with four digits of year.
  model["expires_at"] = "9999-12-31T23:59:59Z";
  model["context_length"] = context_;
  return {{"models", json::array({model})}};
}

}  // namespace kvserve::server
