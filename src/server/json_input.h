#pragma once
// JSON from clients and models, shared by the server's parsers: optional
// fields of request bodies, and a parse with bounded nesting. Values are
// copied, compared, checked and printed recursively, so no JSON text from
// outside may nest without bound (a schema sent as a string, tool-call
// arguments, model output parsed for calls).
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/json_scan.h"

namespace kvserve::server {

// Request bodies and the JSON texts inside them nest at most this deep
// (OpenAI's nest about 5).
inline constexpr int kMaxJsonDepth = 64;

// JSON text is parsed as ordered_json (for a schema's key order) only when no
// object in it has more members than this: ordered_json's key lookup is a
// linear search (quadratic parse). Past it, keys come out sorted.
inline constexpr int64_t kMaxOrderedMembers = 10000;

// The field, or nullptr when it is absent or null (null means "default" in
// OpenAI's API). Safe on any JSON value: a non-object has no fields.
inline const nlohmann::json* field(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// `text` parsed, or nullopt when it is not JSON or nests deeper than
// kMaxJsonDepth. Json: nlohmann::json or nlohmann::ordered_json.
// (Depth is checked by a scan first: nlohmann's parse callback is quadratic.)
template <class Json>
std::optional<Json> parse_bounded_json(std::string_view text) {
  if (json_nesting_depth(text) > kMaxJsonDepth) return std::nullopt;
  Json value = Json::parse(text, nullptr, false);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

}  // namespace kvserve::server
