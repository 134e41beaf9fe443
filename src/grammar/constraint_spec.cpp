#include "grammar/constraint_spec.h"

namespace kvserve {

const char* constraint_kind_name(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonObject: return "json_object";
    case ConstraintKind::kJsonSchema: return "json_schema";
    case ConstraintKind::kRegex: return "regex";
    case ConstraintKind::kChoice: return "choice";
    case ConstraintKind::kGrammar: return "grammar";
    case ConstraintKind::kStructuralTag: return "structural_tag";
  }
  return "constraint";
}

std::string ConstraintSpec::key() const {
  // Length-prefixed parts: no two different specs share a key.
  std::string out = constraint_kind_name(kind);
  out += '\n' + std::to_string(text.size()) + ':' + text;
  for (const std::string& c : choices) out += '\n' + std::to_string(c.size()) + ':' + c;
  return out;
}

size_t ConstraintSpec::size_bytes() const {
  size_t bytes = text.size();
  for (const std::string& c : choices) bytes += c.size();
  return bytes;
}

}  // namespace kvserve
