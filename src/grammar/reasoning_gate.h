#pragma once
// A reasoning model (Qwen3, DeepSeek-R1) thinks between <think> and </think>
// before it answers. Two things act on its output at the token level:
//  - an output constraint (a JSON schema, the tool calls' grammar) applies to
//    the answer only, from the first token after the end tag (whitespace there
//    is let through first), never to the thinking;
//  - a thinking budget: after that many tokens inside the block, the end tag's
//    tokens are forced (once a UTF-8 character in progress is complete), and
//    the model goes on with its answer.
// gate_after_reasoning() wraps a request's constraint (or none) with both;
// the engine sees one more TokenMatcher (docs/server.md, "Reasoning models").
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/token_constraint.h"

namespace kvserve {

class Tokenizer;

// The tags of a reasoning syntax as tokens of one vocabulary: built once per
// server (the whitespace scan reads every token).
struct ReasoningTags {
  std::string start;               // "<think>"
  std::string end;                 // "</think>"
  int32_t start_id = -1;           // the start tag as one token (-1: it takes several)
  std::vector<int32_t> end_ids;    // what the budget forces
  std::vector<int32_t> whitespace_ids;  // tokens of nothing but whitespace (allowed before the answer's constraint)

  static ReasoningTags of(const Tokenizer& tokenizer, std::string start, std::string end);
};

struct ReasoningGateOptions {
  bool starts_in_reasoning = false;  // the prompt opened the block (the output only ends it)
  int64_t budget = -1;               // tokens inside the block before the end tag is forced; -1: no budget
};

// `inner` may be null (a budget alone). The result holds `tags` and
// `tokenizer` by reference: both must outlive it (the server owns them).
std::shared_ptr<const CompiledConstraint> gate_after_reasoning(const ReasoningTags& tags, const Tokenizer& tokenizer,
                                                               std::shared_ptr<const CompiledConstraint> inner,
                                                               ReasoningGateOptions options);

}  // namespace kvserve
