#pragma once
// Jinja's values, as JSON (chat_template_ast.h), and what the renderer does
// with them: truthiness, text, numbers, operators, subscripts and slices, and
// the work budget every operation charges (kMaxWorkBytes).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/chat_template_ast.h"

namespace kvserve::chat_template_detail {

// Bytes a value takes in memory, roughly: a JSON node, and for a string its
// heap object and allocation headers too.
inline constexpr size_t kValueBytes = 16, kStringBytes = 64;

// The work one apply() may do (kMaxWorkBytes): operations charge what they
// touch before or as they build it, so a render fails before it runs long or
// holds much memory.
class WorkBudget {
 public:
  explicit WorkBudget(size_t limit) : limit_(limit) {}

  void charge(size_t bytes) {
    used_ += std::min(bytes, limit_ + 1);  // cannot wrap around
    if (used_ > limit_)
      fail("the template touched more than " +
           (limit_ >= (size_t{1} << 30) ? std::to_string(limit_ >> 30) + " GiB" : std::to_string(limit_ >> 20) + " MiB") +
           " of values (bytes made, copied or searched)");
  }
  // A linear-time substring search (text_search.h) of `needle` in `haystack`.
  void charge_search(size_t haystack_bytes, size_t needle_bytes) {
    charge((haystack_bytes + needle_bytes) * (needle_bytes == 1 ? 1 : kSearchCostPerByte));
  }

 private:
  size_t limit_;
  size_t used_ = 0;
};

// Jinja's truthiness: undefined, none, false, 0, "" and empty lists and dicts are false.
bool truthy(const json& v);
// Fails before a string of `bytes` is built (kMaxTextBytes).
void check_text_size(size_t bytes, const char* what);
// JSON text of a value; invalid UTF-8 is replaced.
std::string dump(const json& v, int indent = -1);
// Jinja's str(): Python spellings for booleans and None.
std::string to_text(const json& v);
// The length to_text(v) would have, without making it (0 when not cheap to know).
size_t text_size(const json& v);
// The value as a string or an integer, or a failure naming `what` needed it.
const std::string& as_string(const json& v, const char* what);
int64_t as_int(const json& v, const char* what);

// + - * / // % (Python's semantics; integers checked for overflow).
json arithmetic(const std::string& op, const json& a, const json& b);
// == != < > <= >= and `in`.
json compare(const std::string& op, const json& a, const json& b, WorkBudget& work);
// obj[key] and obj[start:stop:step]: undefined where Python would raise an IndexError or KeyError.
json subscript(const json& obj, const json& key);
json slice(const json& obj, const json& start, const json& stop, const json& step);
// Bytes a value takes in memory, roughly; fails past kMaxValueDepth.
size_t footprint(const json& v, int depth);

}  // namespace kvserve::chat_template_detail
