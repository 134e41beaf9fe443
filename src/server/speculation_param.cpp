#include "server/speculation_param.h"

#include <string>

#include "core/error.h"
#include "server/api_error.h"
#include "speculation/request_speculation.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

constexpr const char* kField = "speculative";

SpeculativeMode mode_of(const json& value, bool has_draft_model) {
  const std::string param = std::string(kField) + ".mode";
  if (!value.is_string()) throw invalid(param, param + " must be \"ngram\", \"draft\", \"auto\" or \"none\"");
  SpeculativeMode mode = SpeculativeMode::kNone;
  try {
    mode = parse_speculative_mode(value.get<std::string>());
  } catch (const Error& e) {
    throw invalid(param, e.what());
  }
  if (mode == SpeculativeMode::kDraftModel && !has_draft_model)
    throw invalid(param, "speculative mode 'draft' needs a draft model: start the server with --draft FILE "
                         "(or use mode \"ngram\" or \"auto\")");
  return mode;
}

int64_t draft_k_of(const json& value) {
  const std::string param = std::string(kField) + ".draft_k";
  if (!value.is_number_integer()) throw invalid(param, param + " must be an integer");
  const bool too_big = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kMaxEngineDraftK);
  if (too_big || value.get<int64_t>() < 1 || value.get<int64_t>() > kMaxEngineDraftK)
    throw invalid(param, param + " must be in [1, " + std::to_string(kMaxEngineDraftK) + "], got " + value.dump());
  return value.get<int64_t>();
}

SpeculationSettings from_object(const json& object, SpeculationSettings s, bool has_draft_model) {
  s.mode = SpeculativeMode::kNgram;
  for (const auto& [key, value] : object.items()) {
    if (value.is_null()) continue;
    if (key == "mode") s.mode = mode_of(value, has_draft_model);
    else if (key == "draft_k") s.draft_k = draft_k_of(value);
    else if (key == "adaptive_k") {
      if (!value.is_boolean()) throw invalid("speculative.adaptive_k", "speculative.adaptive_k must be true or false");
      s.adaptive_k = value.get<bool>();
    } else {
      throw invalid(std::string(kField) + "." + key,
                    "unknown key '" + key + "' in speculative (expected mode, draft_k, adaptive_k)");
    }
  }
  return s;
}

}  // namespace

SpeculationSettings parse_speculation(const json& body, const SpeculationSettings& server_default,
                                      bool has_draft_model) {
  const auto it = body.find(kField);
  if (it == body.end() || it->is_null()) return server_default;
  SpeculationSettings s = server_default;
  if (it->is_boolean()) {
    s.mode = it->get<bool>() ? SpeculativeMode::kNgram : SpeculativeMode::kNone;
    return s;
  }
  if (!it->is_object())
    throw invalid(kField, "speculative must be true, false or an object {\"mode\", \"draft_k\", \"adaptive_k\"}");
  return from_object(*it, s, has_draft_model);
}

}  // namespace kvserve::server
