#pragma once
// The output constraint of a request with tools (docs/structured_output.md):
//   tool_choice "none"              no constraint
//   "auto"                          free text until the format's opener (e.g. <tool_call>), then a
//                                   valid call of one of the tools, then free text again
//   "required" / a named function   nothing but calls (of that function), one after another
// Built as an xgrammar structural tag from the format's call shapes.
#include <optional>

#include "grammar/constraint_spec.h"
#include "server/tool_calls.h"

namespace kvserve::server {

std::optional<ConstraintSpec> tool_call_constraint(const ToolRequest& tools, ToolCallFormat format);

}  // namespace kvserve::server
