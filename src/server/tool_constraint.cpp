#include "server/tool_constraint.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

json tags_of(const std::vector<ToolCallShape>& shapes) {
  json tags = json::array();
  for (const ToolCallShape& s : shapes)
    tags.push_back({{"type", "tag"},
                    {"begin", s.begin},
                    {"content", {{"type", "json_schema"}, {"json_schema", s.schema}}},
                    {"end", s.end}});
  return tags;
}

}  // namespace

std::optional<ConstraintSpec> tool_call_constraint(const ToolRequest& tools, ToolCallFormat format) {
  if (!tools.calls_allowed()) return std::nullopt;
  const std::vector<ToolCallShape> shapes = tool_call_shapes(tools, format);
  const bool one_call = !tools.parallel_tool_calls;
  json structure;
  if (tools.choice.kind == ToolChoice::kAuto) {
    std::vector<std::string> triggers = tool_call_triggers(format);
    json tags = tags_of(shapes);
    if (format == ToolCallFormat::kHermes) {
      // Qwen2.5 models often write a bare {"name": ...} call without the
      // <tool_call> tags (which the parser takes too): constrain those as well.
      for (const std::string& t : tool_call_triggers(ToolCallFormat::kGenericJson)) triggers.push_back(t);
      for (const json& tag : tags_of(tool_call_shapes(tools, ToolCallFormat::kGenericJson))) tags.push_back(tag);
    }
    structure = {{"type", "triggered_tags"},
                 {"triggers", triggers},
                 {"tags", tags},
                 {"at_least_one", false},
                 {"stop_after_first", one_call}};
  } else {  // required or named: calls only, no text around them
    structure = {{"type", "tags_with_separator"},
                 {"tags", tags_of(shapes)},
                 {"separator", "\n"},
                 {"at_least_one", true},
                 {"stop_after_first", one_call}};
  }
  return ConstraintSpec{ConstraintKind::kStructuralTag, json{{"type", "structural_tag"}, {"format", structure}}.dump(), {}};
}

}  // namespace kvserve::server
