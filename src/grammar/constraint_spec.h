#pragma once
// What a request asks its output to follow, before compilation: the fields
// of OpenAI's response_format, vLLM's structured_outputs / guided_* and
// llama.cpp's json_schema / grammar all become one ConstraintSpec.
#include <string>
#include <vector>

#include "core/error.h"

namespace kvserve {

enum class ConstraintKind {
  kJsonObject,     // any JSON object (response_format json_object)
  kJsonSchema,     // text: a JSON schema
  kRegex,          // text: a regular expression the whole output matches
  kChoice,         // choices: the output is exactly one of them
  kGrammar,        // text: an EBNF / GBNF grammar whose start rule is `root`
  kStructuralTag,  // text: an xgrammar structural tag (JSON): free text with constrained parts (tool calls)
};

const char* constraint_kind_name(ConstraintKind kind);

struct ConstraintSpec {
  ConstraintKind kind = ConstraintKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;

  // The cache key: equal keys compile to the same constraint.
  std::string key() const;
  // Bytes of the specification (text or choices), for the size limit.
  size_t size_bytes() const;
};

// A constraint that cannot be compiled; `reason` says how the server answers.
class ConstraintError : public Error {
 public:
  enum class Reason {
    kInvalid,      // malformed schema / regex / grammar, unsupported keyword: 400
    kTooLarge,     // past ConstraintLimits::max_spec_bytes: 400
    kTimeout,      // compiling took longer than the limit: 400 (a later retry may hit the cache)
    kBusy,         // too many compiles in flight: 503
    kUnavailable,  // kvserve was built without xgrammar: 400
  };
  ConstraintError(Reason reason, const std::string& message) : Error(message), reason_(reason) {}
  Reason reason() const { return reason_; }

 private:
  Reason reason_;
};

}  // namespace kvserve
