#pragma once
// The request fields that constrain the output, from every API users send
// them in (docs/structured_output.md), turned into one ConstraintSpec:
//   OpenAI      response_format {"type": "text" | "json_object"}
//               response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
//   vLLM        structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object" | "structural_tag"}
//               guided_json, guided_regex, guided_choice, guided_grammar (older names)
//   llama.cpp   json_schema (a schema), grammar (GBNF)
// At most one of them may be given. Throws ApiError 400 naming the field.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/constraint_spec.h"
#include "server/json_key_order.h"

namespace kvserve::server {

struct ConstraintParam {
  ConstraintSpec spec;
  std::string param;  // the request field it came from, for errors ("response_format.json_schema.schema")
  // A schema given as an object: its keys in the body, for restore_key_order.
  KeyPath location;
};

std::optional<ConstraintParam> parse_constraint(const nlohmann::json& body);

// Where a body may hold a schema as an object: the paths whose objects the
// body's one parse also copies in written order (parse_request_body).
std::vector<KeyPath> schema_object_paths();

// nlohmann::json sorts object keys, but a schema's property order is the
// order the output is generated in (pydantic's field order): the schema's
// text becomes its copy in written order, taken while the body was parsed.
void restore_key_order(ConstraintParam& constraint, const KeyOrderCapture::Copies& schemas_in_order);

}  // namespace kvserve::server
