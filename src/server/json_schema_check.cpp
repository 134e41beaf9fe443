#include "server/json_schema_check.h"

#include <set>

#include "server/api_error.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

// Keywords xgrammar 0.2.9 does not enforce (it logs a warning and goes on).
const std::set<std::string> kUnsupported = {"not",         "if",       "then",        "else",
                                            "dependentRequired", "dependentSchemas", "uniqueItems",
                                            "contains",    "minContains", "maxContains"};
const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
const std::set<std::string> kCounts = {"minItems",  "maxItems",      "minLength",    "maxLength",
                                       "minProperties", "maxProperties"};
const std::set<std::string> kBounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
const std::set<std::string> kSchemaLists = {"anyOf", "oneOf", "allOf", "prefixItems"};
const std::set<std::string> kSchemaMaps = {"properties", "$defs", "definitions", "patternProperties"};
const std::set<std::string> kSchemaValues = {"items", "additionalProperties", "unevaluatedProperties",
                                             "unevaluatedItems", "propertyNames"};

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

class SchemaChecker {
 public:
  explicit SchemaChecker(std::string param) : param_(std::move(param)) {}

  void check(const json& schema, const std::string& pointer) {
    if (schema.is_boolean()) return;
    if (!schema.is_object()) fail(pointer, "a schema must be an object or a boolean");
    // Combinations the grammar engine would ignore part of.
    if (schema.contains("format") && (schema.contains("minLength") || schema.contains("maxLength")))
      fail(pointer, "minLength / maxLength together with format is not supported");
    if (schema.contains("multipleOf") && schema.contains("type") && schema["type"] == "number")
      fail(pointer + "/multipleOf", "multipleOf is supported for integers only");
    if (schema.contains("allOf") && schema["allOf"].is_array() && schema["allOf"].size() > 1)
      fail(pointer + "/allOf", "allOf with more than one schema is not supported (merge them into one)");
    check_required_exist(schema, pointer);
    for (const auto& [key, value] : schema.items()) check_keyword(key, value, pointer + "/" + escape_pointer(key));
  }

 private:
  [[noreturn]] void fail(const std::string& pointer, const std::string& what) const {
    throw invalid(param_, param_ + " at " + (pointer.empty() ? "/" : pointer) + ": " + what);
  }

  void check_keyword(const std::string& key, const json& value, const std::string& at) {
    if (kUnsupported.count(key)) fail(at, "the keyword \"" + key + "\" is not supported by this server's JSON schema engine");
    if (key == "type") check_type(value, at);
    else if (kCounts.count(key)) {
      if (!value.is_number_integer() || (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() < 0))
        fail(at, "must be a non-negative integer");
    } else if (kBounds.count(key)) {
      if (!value.is_number()) fail(at, "must be a number");
      if (key == "multipleOf" && value.get<double>() <= 0) fail(at, "must be greater than 0");
    } else if (key == "required") {
      if (!value.is_array()) fail(at, "must be a list of property names");
      for (const json& name : value)
        if (!name.is_string()) fail(at, "must be a list of property names");
    } else if (key == "enum") {
      if (!value.is_array() || value.empty()) fail(at, "must be a non-empty list");
    } else if (key == "pattern" || key == "format" || key == "$ref" || key == "title" || key == "description") {
      if (!value.is_string()) fail(at, "must be a string");
      const std::string& text = value.get_ref<const std::string&>();
      if (key == "$ref" && text != "#" && text.rfind("#/", 0) != 0)
        fail(at, "only references inside the schema (\"#\" or \"#/...\") are supported, got \"" + text + "\"");
    } else if (kSchemaLists.count(key)) {
      if (!value.is_array() || value.empty()) fail(at, "must be a non-empty list of schemas");
      for (size_t i = 0; i < value.size(); ++i) check(value[i], at + "/" + std::to_string(i));
    } else if (kSchemaMaps.count(key)) {
      if (!value.is_object()) fail(at, "must be an object of schemas");
      for (const auto& [name, sub] : value.items()) check(sub, at + "/" + escape_pointer(name));
    } else if (kSchemaValues.count(key)) {
      check(value, at);
    }
  }

  // Strict mode allows no properties beyond "properties": a required one
  // missing there could never be written (xgrammar would drop it silently).
  void check_required_exist(const json& schema, const std::string& pointer) const {
    if (!schema.contains("required") || !schema["required"].is_array()) return;
    const auto extra = schema.find("additionalProperties");
    if (extra != schema.end() && !(extra->is_boolean() && !extra->get<bool>())) return;
    if (schema.contains("patternProperties")) return;
    const json empty = json::object();
    const auto props = schema.find("properties");
    const json& names = props != schema.end() && props->is_object() ? *props : empty;
    for (const json& name : schema["required"])
      if (name.is_string() && !names.contains(name.get<std::string>()))
        fail(pointer + "/required", "the required property \"" + name.get<std::string>() +
                                        "\" is not in properties (no other properties are allowed)");
  }

  void check_type(const json& value, const std::string& at) const {
    auto known = [&](const json& t) {
      if (!t.is_string() || !kTypes.count(t.get<std::string>()))
        fail(at, "must be one of object, array, string, number, integer, boolean, null (or a list of them), got " + t.dump());
    };
    if (value.is_array()) {
      if (value.empty()) fail(at, "must not be an empty list");
      for (const json& t : value) known(t);
    } else {
      known(value);
    }
  }

  std::string param_;
};

}  // namespace

void check_json_schema(const json& schema, const std::string& param) { SchemaChecker(param).check(schema, ""); }

}  // namespace kvserve::server
