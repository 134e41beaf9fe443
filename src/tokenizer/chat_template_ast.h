#pragma once
// The parsed form of a chat template (see chat_template.h), shared by the
// parser (chat_template_parse.cpp) and the evaluator (chat_template.cpp).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvserve::chat_template_detail {

using json = nlohmann::json;

// A discarded JSON value stands for Jinja's `undefined`.
inline json undefined() { return json(json::value_t::discarded); }
inline bool is_undefined(const json& v) { return v.is_discarded(); }

// Throws kvserve::Error prefixed with "chat template: ".
[[noreturn]] void fail(const std::string& message);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { kLiteral, kName, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kList, kDict, kIf };
  Kind kind;
  std::string name;                // variable, attribute, operator, filter or test
  json value;                      // kLiteral
  std::vector<ExprPtr> args;       // operands; nullptr for an omitted slice bound or else branch
  std::vector<std::string> keywords;  // kCall / kFilter: keyword of each argument after the first ("" positional)
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet };
  Kind kind;
  std::string text;                      // kText
  std::vector<std::string> names;        // kFor: loop variables; kSet: variable [, attribute]
  ExprPtr expr;                          // kOutput, kFor (iterable), kSet (value)
  std::vector<ExprPtr> conditions;       // kIf: one per branch with a condition; kFor: the optional filter
  std::vector<std::vector<Node>> bodies; // kIf: branches (else last); kFor: body, else body
};

// Throws kvserve::Error (through fail) on syntax outside the supported subset.
std::vector<Node> parse_template(std::string_view source);

}  // namespace kvserve::chat_template_detail
