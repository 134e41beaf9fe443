#pragma once
// JSON from clients and models, shared by the server's parsers: optional
// fields of request bodies, and a parse with bounded nesting. Values are
// copied, compared, checked and printed recursively, so no JSON text from
// outside may nest without bound (a schema sent as a string, tool-call
// arguments, model output parsed for calls).
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kvserve::server {

// Request bodies and the JSON texts inside them nest at most this deep
// (OpenAI's nest about 5).
inline constexpr int kMaxJsonDepth = 64;

// The field, or nullptr when it is absent or null (null means "default" in
// OpenAI's API). Safe on any JSON value: a non-object has no fields.
inline const nlohmann::json* field(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// `text` parsed, or nullopt when it is not JSON or nests deeper than
// kMaxJsonDepth. Json: nlohmann::json or nlohmann::ordered_json.
template <class Json>
std::optional<Json> parse_bounded_json(std::string_view text) {
  struct TooDeep {};
  const typename Json::parser_callback_t limit_depth = [](int depth, typename Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    Json value = Json::parse(text, limit_depth, false);
    if (value.is_discarded()) return std::nullopt;
    return value;
  } catch (const TooDeep&) {
    return std::nullopt;
  }
}

}  // namespace kvserve::server
