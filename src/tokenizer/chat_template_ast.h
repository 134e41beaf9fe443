#pragma once
// The parsed form of a chat template (see chat_template.h), shared by the
// parser (chat_template_parse.cpp) and the renderer (chat_template.cpp).
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

// Limits on what a template may do. A template comes from a downloaded model
// file, so it is untrusted code: these keep one from exhausting the stack,
// memory or time of the server. Breaking one is a kvserve::Error (see
// docs/reliability.md).
inline constexpr int kMaxBlockDepth = 64;               // {% if %} / {% for %} nested in each other
inline constexpr int kMaxExpressionDepth = 128;         // operators, calls, brackets nested in one expression
inline constexpr int kMaxValueDepth = 64;               // lists and dicts nested in a value
inline constexpr int64_t kMaxLoopIterations = 1 << 20;  // all {% for %} iterations of one apply(); also range()
inline constexpr size_t kMaxTextBytes = 64 << 20;       // the output, and any one string value
// The work budget of one apply(), in bytes touched: every value evaluated
// counts its size in memory (evaluating copies it) plus kStepCost, every node
// executed kStepCost, every value an operation builds piece by piece (split()
// pieces, a loop's characters) its size plus kStepCost as it is built, and a
// substring search (`in`, split, replace) kSearchCostPerByte per byte of
// haystack and needle. The costs are set so that a unit takes about a
// nanosecond at most (docs/reliability.md); everything a render keeps alive
// was counted, so the budget bounds its memory too.
inline constexpr size_t kMaxWorkBytes = size_t{1} << 30;
inline constexpr size_t kSearchCostPerByte = 8;   // two-way search, worst case (a 1-byte needle: memchr, 1)
inline constexpr size_t kStepCost = 256;          // interpreting a node or expression, besides its value
inline constexpr size_t kMaxErrorBytes = 1024;    // raise_exception()'s message (it becomes the response)

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind { kLiteral, kName, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBinary, kList, kDict, kIf };
  Kind kind;
  std::string name;                // variable, attribute, operator, filter or test
  json value;                      // kLiteral
  std::vector<ExprPtr> args;       // operands; nullptr for an omitted slice bound or else branch
  std::vector<std::string> keywords;  // kCall / kFilter: keyword of each argument after the first ("" positional)
  int depth = 1;                   // 1 + the deepest argument's depth: how deep evaluating it recurses
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
