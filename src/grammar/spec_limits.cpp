#include "grammar/spec_limits.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>

#include "core/json_scan.h"
#include "grammar/repetition_scan.h"

namespace kvserve {
namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& message) { throw ConstraintError(ConstraintError::Reason::kTooLarge, message); }

std::string pointer_step(const std::string& pointer, const std::string& key) {
  std::string out = pointer + "/";
  for (const char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// A spec's JSON text parsed, nesting at most max_depth levels (it is walked recursively).
json parse_bounded(const std::string& text, int64_t max_depth) {
  if (json_nesting_depth(text) > max_depth) refuse("the JSON nests deeper than " + std::to_string(max_depth) + " levels");
  return json::parse(text, nullptr, false);  // discarded when invalid: xgrammar reports it
}

void check_pattern(std::string_view pattern, PatternSyntax syntax, const std::string& pointer,
                   const ConstraintLimits& limits, int64_t& repeated) {
  if (std::optional<std::string> problem = repetition_over_limits(pattern, syntax, limits, repeated))
    refuse((pointer.empty() ? "" : pointer + ": ") + *problem);
}

struct CountKeyword {
  const char* name;
  int64_t ConstraintLimits::*cap;
};
constexpr std::array<CountKeyword, 8> kCountKeywords = {{
    {"minLength", &ConstraintLimits::max_string_length},
    {"maxLength", &ConstraintLimits::max_string_length},
    {"minItems", &ConstraintLimits::max_array_items},
    {"maxItems", &ConstraintLimits::max_array_items},
    {"minContains", &ConstraintLimits::max_array_items},
    {"maxContains", &ConstraintLimits::max_array_items},
    {"minProperties", &ConstraintLimits::max_object_properties},
    {"maxProperties", &ConstraintLimits::max_object_properties},
}};
constexpr std::array<const char*, 4> kSchemaLists = {"anyOf", "oneOf", "allOf", "prefixItems"};
constexpr std::array<const char*, 4> kSchemaMaps = {"properties", "$defs", "definitions", "dependentSchemas"};
constexpr std::array<const char*, 10> kSchemaValues = {"items",         "additionalProperties", "unevaluatedProperties",
                                                       "unevaluatedItems", "propertyNames",    "contains",
                                                       "not",           "if",                   "then",
                                                       "else"};

template <size_t N>
bool one_of(const std::array<const char*, N>& names, const std::string& key) {
  for (const char* name : names)
    if (key == name) return true;
  return false;
}

// Walks a schema's subschemas (not its data: enum, const, default, examples).
class SchemaWalk {
 public:
  SchemaWalk(const ConstraintLimits& limits, int64_t& repeated) : limits_(limits), repeated_(repeated) {}

  void schema(const json& s, const std::string& pointer, int64_t depth) {
    if (!s.is_object()) return;
    if (depth > limits_.max_nesting)
      refuse((pointer.empty() ? "/" : pointer) + ": schemas nest deeper than " + std::to_string(limits_.max_nesting) +
             " levels");
    for (const auto& [key, value] : s.items()) keyword(key, value, pointer_step(pointer, key), depth);
  }

 private:
  void keyword(const std::string& key, const json& value, const std::string& at, int64_t depth) {
    for (const CountKeyword& k : kCountKeywords)
      if (key == k.name && value.is_number() && value.get<double>() > static_cast<double>(limits_.*k.cap))
        refuse(at + " is " + value.dump() + ", at most " + std::to_string(limits_.*k.cap));
    if (key == "pattern" && value.is_string())
      check_pattern(value.get_ref<const std::string&>(), PatternSyntax::kRegex, at, limits_, repeated_);
    if (key == "properties" && value.is_object()) {
      properties_ += static_cast<int64_t>(value.size());
      if (properties_ > limits_.max_schema_properties)
        refuse(at + ": the schema has more than " + std::to_string(limits_.max_schema_properties) +
               " properties in all");
    }
    if (key == "patternProperties" && value.is_object()) {
      for (const auto& [name, sub] : value.items()) {
        check_pattern(name, PatternSyntax::kRegex, pointer_step(at, name), limits_, repeated_);
        schema(sub, pointer_step(at, name), depth + 1);
      }
    } else if (one_of(kSchemaMaps, key) && value.is_object()) {
      for (const auto& [name, sub] : value.items()) schema(sub, pointer_step(at, name), depth + 1);
    } else if ((one_of(kSchemaLists, key) || key == "items") && value.is_array()) {
      for (size_t i = 0; i < value.size(); ++i) schema(value[i], at + "/" + std::to_string(i), depth + 1);
    } else if (one_of(kSchemaValues, key)) {
      schema(value, at, depth + 1);
    }
  }

  const ConstraintLimits& limits_;
  int64_t& repeated_;  // positions of counted repetitions in the patterns so far
  int64_t properties_ = 0;
};

// A structural tag's formats: the schemas, regexes and grammars inside, and repeat counts.
void walk_structural_tag(const json& value, const std::string& pointer, const ConstraintLimits& limits,
                         int64_t& repeated) {
  if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      walk_structural_tag(value[i], pointer + "/" + std::to_string(i), limits, repeated);
    return;
  }
  if (!value.is_object()) return;
  const auto type = value.find("type");
  const std::string kind = type != value.end() && type->is_string() ? type->get<std::string>() : "";
  for (const auto& [key, sub] : value.items()) {
    const std::string at = pointer_step(pointer, key);
    if (key == "json_schema" && (kind == "json_schema" || kind == "qwen_xml_parameter")) {
      SchemaWalk walk(limits, repeated);
      if (sub.is_string()) walk.schema(parse_bounded(sub.get<std::string>(), 4 * limits.max_nesting), at, 0);
      else walk.schema(sub, at, 0);
    } else if (key == "pattern" && kind == "regex" && sub.is_string()) {
      check_pattern(sub.get_ref<const std::string&>(), PatternSyntax::kRegex, at, limits, repeated);
    } else if (key == "grammar" && kind == "grammar" && sub.is_string()) {
      check_pattern(sub.get_ref<const std::string&>(), PatternSyntax::kEbnf, at, limits, repeated);
    } else if ((key == "min" || key == "max") && kind == "repeat" && sub.is_number() &&
               sub.get<double>() > static_cast<double>(limits.max_repetition)) {
      refuse(at + " is " + sub.dump() + ", at most " + std::to_string(limits.max_repetition));
    } else {
      walk_structural_tag(sub, at, limits, repeated);
    }
  }
}

void check_size(const ConstraintSpec& spec, const ConstraintLimits& limits) {
  if (spec.size_bytes() > limits.max_spec_bytes)
    refuse(std::string("the ") + constraint_kind_name(spec.kind) + " has " + std::to_string(spec.size_bytes()) +
           " bytes; this server compiles at most " + std::to_string(limits.max_spec_bytes));
  if (spec.choices.size() > limits.max_choices)
    refuse("at most " + std::to_string(limits.max_choices) + " choices are accepted, got " +
           std::to_string(spec.choices.size()));
}

}  // namespace

void check_schema_limits(const json& schema, const ConstraintLimits& limits) {
  int64_t repeated = 0;
  SchemaWalk(limits, repeated).schema(schema, "", 0);
}

void check_spec_limits(const ConstraintSpec& spec, const ConstraintLimits& limits) {
  check_size(spec, limits);
  const int64_t json_depth = 4 * limits.max_nesting;  // a schema level is one to three JSON levels
  int64_t repeated = 0;
  switch (spec.kind) {
    case ConstraintKind::kJsonSchema: check_schema_limits(parse_bounded(spec.text, json_depth), limits); break;
    case ConstraintKind::kStructuralTag:
      walk_structural_tag(parse_bounded(spec.text, json_depth), "", limits, repeated);
      break;
    case ConstraintKind::kRegex: check_pattern(spec.text, PatternSyntax::kRegex, "", limits, repeated); break;
    case ConstraintKind::kGrammar: check_pattern(spec.text, PatternSyntax::kEbnf, "", limits, repeated); break;
    case ConstraintKind::kJsonObject:
    case ConstraintKind::kChoice: break;  // bounded by their size
  }
}

}  // namespace kvserve
