#pragma once
// The caps of ConstraintLimits on a spec, checked before it is compiled (in
// the requester's thread, by a walk that costs about as much as parsing the
// spec once): its size, and the numbers that drive the compiled grammar's
// size: JSON schema lengths, item and property counts, nesting, and counted
// repetitions in regexes, schema patterns, grammars and structural tags.
#include <nlohmann/json.hpp>

#include "grammar/constraint_limits.h"
#include "grammar/constraint_spec.h"

namespace kvserve {

// Throws ConstraintError kTooLarge naming the first part past a cap, for a
// JSON schema (or a structural tag) by its JSON pointer:
// "/properties/a/maxLength is 100000000, at most 10000".
void check_spec_limits(const ConstraintSpec& spec, const ConstraintLimits& limits);

// The same for one JSON schema (a tool's parameters).
void check_schema_limits(const nlohmann::json& schema, const ConstraintLimits& limits);

}  // namespace kvserve
