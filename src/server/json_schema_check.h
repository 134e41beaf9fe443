#pragma once
// Checks a request's JSON schema before it is compiled, so that a 400 can name
// the bad part by its JSON pointer ("response_format.json_schema.schema at
// /properties/age/minimum: must be a number"), and refuses the keywords the
// grammar engine would silently ignore (not, if/then/else, dependent*,
// uniqueItems, contains...), whose output would then not honour the schema.
#include <string>

#include <nlohmann/json.hpp>

namespace kvserve::server {

// Throws ApiError 400 (param = `param`) at the first problem.
void check_json_schema(const nlohmann::json& schema, const std::string& param);

}  // namespace kvserve::server
