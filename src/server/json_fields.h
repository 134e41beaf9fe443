#pragma once
// Reading typed members of request objects with errors that name the field:
// what the Messages and Responses translations (anthropic_messages.cpp,
// responses_request.cpp) both read their blocks and items with.
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_input.h"

namespace kvserve::server {

// obj["type"] when it is a string, else "".
inline std::string type_of(const nlohmann::json& obj) {
  const nlohmann::json* type = field(obj, "type");
  return type && type->is_string() ? type->get<std::string>() : "";
}

// obj[key] as a string; a 400 naming `param.key` when it is absent or not a string.
inline const std::string& string_field(const nlohmann::json& obj, const char* key, const std::string& param) {
  const nlohmann::json* v = field(obj, key);
  if (!v || !v->is_string()) throw invalid(param + "." + key, param + "." + key + " must be a string");
  return v->get_ref<const std::string&>();
}

}  // namespace kvserve::server
