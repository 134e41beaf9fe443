#include "server/constraint_param.h"

#include <tuple>
#include <utility>
#include <vector>

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/json_schema_check.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

std::string string_value(const json& v, const std::string& param) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) throw invalid(param, param + " must be a non-empty string");
  return v.get<std::string>();
}

// Where a schema given as an object sits in a body (restore_key_order).
const KeyPath kResponseFormatSchema = {"response_format", "json_schema", "schema"};
const KeyPath kStructuredOutputsJson = {"structured_outputs", "json"};
const KeyPath kGuidedJson = {"guided_json"};
const KeyPath kJsonSchema = {"json_schema"};

// A schema given as JSON text, parsed once: the tree to check, and its text in
// the written key order where that is affordable (else the sorted keys stay).
std::pair<json, std::string> parse_schema_text(const std::string& given, const std::string& param) {
  try {
    JsonKeepingOrder parsed = parse_limited_json_keeping_order(given, {KeyPath{}});
    const auto ordered = parsed.ordered.find(KeyPath{});
    return {std::move(parsed.tree), ordered == parsed.ordered.end() ? "" : ordered->second.dump()};
  } catch (const JsonLimitError&) {
  } catch (const json::exception&) {
  }
  throw invalid(param, param + " is not valid JSON (or nests deeper than " + std::to_string(kMaxJsonDepth) + " levels)");
}

// A schema given as an object (or, as some clients send it, as JSON text).
ConstraintParam schema_constraint(const json& v, const std::string& param, KeyPath location) {
  json schema = v;
  std::string text;
  if (v.is_string()) {
    std::tie(schema, text) = parse_schema_text(v.get_ref<const std::string&>(), param);
    location.clear();  // the text keeps its order
  }
  if (!schema.is_object() && !schema.is_boolean()) throw invalid(param, param + " must be a JSON schema (an object)");
  check_json_schema(schema, param);
  return {{ConstraintKind::kJsonSchema, text.empty() ? schema.dump() : text, {}}, param, std::move(location)};
}

ConstraintParam choice_constraint(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) throw invalid(param, param + " must be a non-empty list of strings");
  std::vector<std::string> choices;
  for (const json& c : v) choices.push_back(string_value(c, param + "[" + std::to_string(choices.size()) + "]"));
  return {{ConstraintKind::kChoice, "", std::move(choices)}, param, {}};
}

ConstraintParam text_constraint(ConstraintKind kind, const json& v, const std::string& param) {
  return {{kind, string_value(v, param), {}}, param, {}};
}

std::optional<ConstraintParam> from_response_format(const json& format) {
  if (!format.is_object() || !format.contains("type") || !format["type"].is_string())
    throw invalid("response_format", "response_format must be an object with a string \"type\"");
  const std::string type = format["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") return ConstraintParam{{ConstraintKind::kJsonObject, "", {}}, "response_format", {}};
  if (type != "json_schema")
    throw invalid("response_format.type", "response_format.type must be \"text\", \"json_object\" or \"json_schema\", got \"" +
                                              type + "\"");
  const json* spec = field(format, "json_schema");
  if (!spec || !spec->is_object())
    throw invalid("response_format.json_schema", "response_format.json_schema must be an object with a \"schema\"");
  if (const json* strict = field(*spec, "strict"); strict && !strict->is_boolean())
    throw invalid("response_format.json_schema.strict", "response_format.json_schema.strict must be true or false");
  const json* schema = field(*spec, "schema");
  // OpenAI allows a json_schema without "schema": any JSON object then.
  if (!schema) return ConstraintParam{{ConstraintKind::kJsonObject, "", {}}, "response_format", {}};
  return schema_constraint(*schema, "response_format.json_schema.schema", kResponseFormatSchema);
}

std::optional<ConstraintParam> from_structured_outputs(const json& v) {
  if (!v.is_object()) throw invalid("structured_outputs", "structured_outputs must be an object");
  std::optional<ConstraintParam> out;
  int given = 0;
  for (const auto& [key, value] : v.items()) {
    if (value.is_null() || key == "disable_any_whitespace" || key == "disable_additional_properties" ||
        key == "whitespace_pattern")
      continue;  // vLLM's options; our JSON is compact and strict already
    const std::string param = "structured_outputs." + key;
    if (key == "json") out = schema_constraint(value, param, kStructuredOutputsJson);
    else if (key == "regex") out = text_constraint(ConstraintKind::kRegex, value, param);
    else if (key == "choice") out = choice_constraint(value, param);
    else if (key == "grammar") out = text_constraint(ConstraintKind::kGrammar, value, param);
    else if (key == "structural_tag") out = text_constraint(ConstraintKind::kStructuralTag, value.is_string() ? value : json(value.dump()), param);
    else if (key == "json_object") {
      if (value != true) continue;
      out = ConstraintParam{{ConstraintKind::kJsonObject, "", {}}, param, {}};
    } else throw invalid(param, param + " is not a structured output kind (json, regex, choice, grammar, json_object, structural_tag)");
    if (++given > 1) throw invalid("structured_outputs", "structured_outputs may hold only one of json, regex, choice, grammar");
  }
  return out;
}

}  // namespace

std::optional<ConstraintParam> parse_constraint(const json& body) {
  std::optional<ConstraintParam> out;
  std::string first;
  auto take = [&](const char* name, std::optional<ConstraintParam> c) {
    if (!c) return;
    if (out) throw invalid(name, std::string("give one output constraint, not both ") + first + " and " + name);
    out = std::move(c);
    first = name;
  };
  if (const json* v = field(body, "response_format")) take("response_format", from_response_format(*v));
  if (const json* v = field(body, "structured_outputs")) take("structured_outputs", from_structured_outputs(*v));
  if (const json* v = field(body, "guided_json")) take("guided_json", schema_constraint(*v, "guided_json", kGuidedJson));
  if (const json* v = field(body, "guided_regex"))
    take("guided_regex", text_constraint(ConstraintKind::kRegex, *v, "guided_regex"));
  if (const json* v = field(body, "guided_choice")) take("guided_choice", choice_constraint(*v, "guided_choice"));
  if (const json* v = field(body, "guided_grammar"))
    take("guided_grammar", text_constraint(ConstraintKind::kGrammar, *v, "guided_grammar"));
  if (const json* v = field(body, "json_schema")) take("json_schema", schema_constraint(*v, "json_schema", kJsonSchema));
  if (const json* v = field(body, "grammar")) take("grammar", text_constraint(ConstraintKind::kGrammar, *v, "grammar"));
  return out;
}

std::vector<KeyPath> schema_object_paths() {
  return {kResponseFormatSchema, kStructuredOutputsJson, kGuidedJson, kJsonSchema};
}

void restore_key_order(ConstraintParam& constraint, const KeyOrderCapture::Copies& schemas_in_order) {
  if (constraint.location.empty()) return;
  // Absent when the schema was too wide to copy in order: the sorted schema stays.
  const auto it = schemas_in_order.find(constraint.location);
  if (it != schemas_in_order.end()) constraint.spec.text = it->second.dump();
}

}  // namespace kvserve::server
