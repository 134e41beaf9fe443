// Evaluating chat templates: walks the AST from chat_template_parse.cpp with
// JSON values, the way Jinja (with Hugging Face's settings) would.
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/chat_template_ast.h"
#include "tokenizer/text_search.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

using namespace chat_template_detail;

struct ChatTemplate::Program {
  std::string source;
  std::vector<Node> nodes;
};

namespace {

constexpr int kMaxJsonIndent = 16;  // tojson(indent)

const char* const kChatMlSource =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Gemma's turn format (the template Gemma 3's instruction-tuned files carry,
// without its image handling): a system message goes before the first user
// turn, the assistant's role is "model".
const char* const kGemmaSource =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + "
    "'\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}"
    "{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

bool truthy(const json& v) {
  if (is_undefined(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

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

// Fails before a string of `bytes` is built.
void check_text_size(size_t bytes, const char* what) {
  if (bytes > kMaxTextBytes)
    fail(std::string(what) + " would make a string of more than " + std::to_string(kMaxTextBytes >> 20) + " MiB");
}

// At least the bytes JSON text takes for `v` (invalid UTF-8 becomes U+FFFD, a
// control byte \u00XX): measured before it is written, since a string can
// grow 6 times over.
size_t json_text_bound(const json& v) {
  if (v.is_string()) {
    size_t bytes = 2;
    for (const char c : v.get_ref<const std::string&>()) {
      const auto b = static_cast<unsigned char>(c);
      const bool short_escape = b == '"' || b == '\\' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t';
      bytes += short_escape ? 2 : b < 0x20 ? 6 : b >= 0x80 ? 3 : 1;
    }
    return bytes;
  }
  if (v.is_object()) {
    size_t bytes = 2;
    for (auto it = v.begin(); it != v.end(); ++it) bytes += json_text_bound(it.key()) + json_text_bound(*it) + 4;
    return bytes;
  }
  if (v.is_array()) {
    size_t bytes = 2;
    for (const json& item : v) bytes += json_text_bound(item) + 2;
    return bytes;
  }
  return 32;  // a number, true, false or null
}

// Template strings may hold any bytes; JSON text replaces invalid UTF-8.
std::string dump(const json& v, int indent = -1) {
  if (v.is_structured() || v.is_string()) check_text_size(json_text_bound(v), "printing a value");
  return v.dump(indent, ' ', false, json::error_handler_t::replace);
}

// Jinja's str(): Python spellings for booleans and None.
std::string to_text(const json& v) {
  if (is_undefined(v)) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return dump(v);
}

// The length to_text(v) would have, without making it (0 when not cheap to know).
size_t text_size(const json& v) {
  if (v.is_string()) return v.get_ref<const std::string&>().size();
  return v.is_structured() ? json_text_bound(v) : 0;
}

const std::string& as_string(const json& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + " needs a string, got " + (is_undefined(v) ? "undefined" : v.type_name()));
  return v.get_ref<const std::string&>();
}

int64_t as_int(const json& v, const char* what) {
  if (!v.is_number()) fail(std::string(what) + " needs a number");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(std::string(what) + ": " + v.dump() + " is out of range");
  if (v.is_number_float()) {
    const double x = v.get<double>();
    // 2^63 itself does not fit in int64_t.
    if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) fail(std::string(what) + ": " + dump(v) + " is out of range");
    return static_cast<int64_t>(x);
  }
  return v.get<int64_t>();
}

// ASCII, as std::isspace in the "C" locale, without a call per byte.
bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

std::string strip(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && is_space(s[b])) ++b;
  while (right && e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string change_case(std::string s, int mode) {  // 0 lower, 1 upper, 2 capitalize, 3 title
  bool word_start = true;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && word_start);
    if (up && c >= 'a' && c <= 'z') s[i] = static_cast<char>(c - 'a' + 'A');
    if (!up && c >= 'A' && c <= 'Z') s[i] = static_cast<char>(c - 'A' + 'a');
    word_start = is_space(c);
  }
  return s;
}

// Bytes a value takes in memory, roughly: a JSON node, and for a string its
// heap object and allocation headers too.
constexpr size_t kValueBytes = 16, kStringBytes = 64;

// Python's str.split: each piece is charged as it is made, so a string of
// separators cannot turn into 64 M strings before the budget notices.
json split(const std::string& s, const json& sep, WorkBudget& work) {
  json out = json::array();
  auto add = [&](size_t from, size_t to) {
    work.charge(kStepCost + kValueBytes + kStringBytes + (to - from));
    out.push_back(s.substr(from, to - from));
  };
  if (is_undefined(sep) || sep.is_null()) {
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i < s.size() && !is_space(s[i])) continue;
      if (i > start) add(start, i);
      start = i + 1;
    }
    return out;
  }
  const std::string& d = as_string(sep, "split");
  if (d.empty()) fail("split: empty separator");
  work.charge_search(s.size(), d.size());
  size_t start = 0, at;
  while ((at = find_linear(s, d, start)) != std::string::npos) add(start, at), start = at + d.size();
  add(start, s.size());
  return out;
}

// Python's str.replace, in one linear pass; the result is checked before it
// grows. Each match costs a search call and two appends: kStepCost / 8.
std::string replace(const std::string& s, const std::string& from, const std::string& to, WorkBudget& work) {
  if (from.empty()) return s;
  work.charge_search(s.size(), from.size());
  std::string out;
  size_t start = 0, at, matches = 0;
  while ((at = find_linear(s, from, start)) != std::string::npos) {
    check_text_size(out.size() + (at - start) + to.size(), "replace()");
    out.append(s, start, at - start).append(to);
    start = at + from.size();
    if (++matches % 4096 == 0) work.charge(4096 * kStepCost / 8);
  }
  check_text_size(out.size() + s.size() - start, "replace()");
  return out.append(s, start);
}

json items_of(const json& obj) {
  if (!obj.is_object()) fail("items() needs a mapping, got " + std::string(is_undefined(obj) ? "undefined" : obj.type_name()));
  json out = json::array();
  for (auto it = obj.begin(); it != obj.end(); ++it) out.push_back(json::array({it.key(), it.value()}));
  return out;
}

// Python's floor division and modulo (rounding toward -inf), checked for overflow.
json integer_division(const std::string& op, int64_t i, int64_t j) {
  if (j == -1) {  // i / -1 overflows for INT64_MIN
    if (op == "%") return 0;
    if (i == INT64_MIN) fail("integer overflow in " + std::to_string(i) + " // -1");
    return -i;
  }
  int64_t quotient = i / j, remainder = i % j;
  if (remainder != 0 && (remainder < 0) != (j < 0)) --quotient, remainder += j;
  return op == "//" ? quotient : remainder;
}

json integer_arithmetic(const std::string& op, int64_t i, int64_t j) {
  int64_t out = 0;
  const bool overflow = op == "+" ? __builtin_add_overflow(i, j, &out)
                        : op == "-" ? __builtin_sub_overflow(i, j, &out)
                                    : __builtin_mul_overflow(i, j, &out);
  if (overflow) fail("integer overflow in " + std::to_string(i) + " " + op + " " + std::to_string(j));
  return out;
}

// Python's str * int.
json repeat(const std::string& s, const json& count) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(0, as_int(count, "string repetition")));
  if (s.empty()) return s;
  if (n > kMaxTextBytes / s.size())
    fail("string repetition would make a string of more than " + std::to_string(kMaxTextBytes >> 20) + " MiB");
  if (s.size() == 1) return std::string(n, s[0]);
  std::string out;
  out.reserve(s.size() * n);
  for (uint64_t k = 0; k < n; ++k) out += s;
  return out;
}

json arithmetic(const std::string& op, const json& a, const json& b) {
  if (op == "+" && a.is_string() && b.is_string()) {
    check_text_size(a.get_ref<const std::string&>().size() + b.get_ref<const std::string&>().size(), "'+'");
    return a.get<std::string>() + b.get<std::string>();
  }
  if (op == "*" && a.is_string() && b.is_number_integer()) return repeat(a.get<std::string>(), b);
  if (op == "*" && b.is_string() && a.is_number_integer()) return repeat(b.get<std::string>(), a);
  if (op == "+" && a.is_array() && b.is_array()) {
    json out = a;
    out.insert(out.end(), b.begin(), b.end());
    return out;
  }
  if (!a.is_number() || !b.is_number())
    fail("cannot apply '" + op + "' to " + (is_undefined(a) ? "undefined" : a.type_name()) + " and " +
         (is_undefined(b) ? "undefined" : b.type_name()));
  const bool ints = a.is_number_integer() && b.is_number_integer();
  const double x = a.get<double>(), y = b.get<double>();
  if ((op == "/" || op == "//" || op == "%") && y == 0) fail("division by zero");
  if (op == "/") return x / y;
  if (ints && (op == "//" || op == "%")) return integer_division(op, as_int(a, op.c_str()), as_int(b, op.c_str()));
  if (op == "//") return std::floor(x / y);
  if (op == "%") return x - y * std::floor(x / y);
  if (ints) return integer_arithmetic(op, as_int(a, op.c_str()), as_int(b, op.c_str()));
  return op == "+" ? x + y : op == "-" ? x - y : x * y;
}

// Comparing values takes time linear in their sizes, which their evaluation
// charged; only a substring search needs its own charge.
bool contains(const json& haystack, const json& needle, WorkBudget& work) {
  if (haystack.is_string()) {
    const std::string& text = haystack.get_ref<const std::string&>();
    const std::string& part = as_string(needle, "in");
    work.charge_search(text.size(), part.size());
    return find_linear(text, part) != std::string::npos;
  }
  if (haystack.is_array()) return std::find(haystack.begin(), haystack.end(), needle) != haystack.end();
  if (haystack.is_object()) return needle.is_string() && haystack.contains(needle.get<std::string>());
  return false;
}

json compare(const std::string& op, const json& a, const json& b, WorkBudget& work) {
  if (op == "==") return !is_undefined(a) && !is_undefined(b) ? a == b : is_undefined(a) && is_undefined(b);
  if (op == "!=") return !compare("==", a, b, work).get<bool>();
  if (op == "in") return contains(b, a, work);
  const bool comparable = (a.is_number() && b.is_number()) || (a.is_string() && b.is_string());
  if (!comparable) fail("cannot compare with '" + op + "'");
  if (op == "<") return a < b;
  if (op == ">") return b < a;
  if (op == "<=") return !(b < a);
  return !(a < b);
}

// Python-style index: negative counts from the end; returns false when out of range.
bool normalize_index(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && i < static_cast<int64_t>(size);
}

json subscript(const json& obj, const json& key) {
  if (obj.is_object() && key.is_string()) {
    auto it = obj.find(key.get<std::string>());
    return it == obj.end() ? undefined() : *it;
  }
  if ((obj.is_array() || obj.is_string()) && key.is_number_integer()) {
    int64_t i = key.get<int64_t>();
    const size_t size = obj.is_array() ? obj.size() : obj.get_ref<const std::string&>().size();
    if (!normalize_index(i, size)) return undefined();
    return obj.is_array() ? obj[static_cast<size_t>(i)]
                          : json(std::string(1, obj.get_ref<const std::string&>()[static_cast<size_t>(i)]));
  }
  return undefined();
}

// s[from:to:by] with bounds already clamped into range.
std::string slice_text(const std::string& s, int64_t from, int64_t to, int64_t by) {
  if (by == 1) return from < to ? s.substr(static_cast<size_t>(from), static_cast<size_t>(to - from)) : "";
  if (by == -1) return from > to ? std::string(s.rbegin() + (static_cast<int64_t>(s.size()) - 1 - from), s.rend() - (to + 1)) : "";
  const int64_t count = by > 0 ? (to - from + by - 1) / by : (from - to - by - 1) / -by;
  std::string out(static_cast<size_t>(std::max<int64_t>(0, count)), '\0');
  for (size_t k = 0; k < out.size(); ++k) out[k] = s[static_cast<size_t>(from + static_cast<int64_t>(k) * by)];
  return out;
}

json slice(const json& obj, const json& start, const json& stop, const json& step) {
  int64_t by = is_undefined(step) || step.is_null() ? 1 : as_int(step, "slice step");
  if (by == 0) fail("slice step cannot be zero");
  const bool is_text = obj.is_string();
  if (!is_text && !obj.is_array())
    fail("cannot slice a " + std::string(is_undefined(obj) ? "undefined" : obj.type_name()));
  const auto n = static_cast<int64_t>(is_text ? obj.get_ref<const std::string&>().size() : obj.size());
  by = std::clamp<int64_t>(by, -n - 1, n + 1);  // a longer step takes one item, as this does, and cannot overflow i
  auto bound = [&](const json& v, int64_t fallback) {
    if (is_undefined(v) || v.is_null()) return fallback;
    int64_t i = as_int(v, "slice");
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, by > 0 ? 0 : -1, by > 0 ? n : n - 1);
  };
  const int64_t from = bound(start, by > 0 ? 0 : n - 1), to = bound(stop, by > 0 ? n : -1);
  if (is_text) return slice_text(obj.get_ref<const std::string&>(), from, to, by);
  json out = json::array();
  for (int64_t i = from; by > 0 ? i < to : i > to; i += by) out.push_back(obj[static_cast<size_t>(i)]);
  return out;
}

json string_method(const std::string& s, const std::string& name, const std::vector<json>& a, WorkBudget& work) {
  auto arg = [&](size_t i) { return i < a.size() ? a[i] : undefined(); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") return strip(s, name != "rstrip", name != "lstrip");
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title")
    work.charge(2 * s.size());  // a byte at a time: slower than a copy
  if (name == "lower") return change_case(s, 0);
  if (name == "upper") return change_case(s, 1);
  if (name == "capitalize") return change_case(s, 2);
  if (name == "title") return change_case(s, 3);
  if (name == "startswith") return s.rfind(as_string(arg(0), "startswith"), 0) == 0;
  if (name == "endswith") {
    const std::string end = as_string(arg(0), "endswith");  // a copy: arg() returns a temporary
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  }
  if (name == "split") return split(s, arg(0), work);
  if (name == "replace") return replace(s, as_string(arg(0), "replace"), as_string(arg(1), "replace"), work);
  fail("unknown string method '" + name + "'");
}

json call_method(const json& self, const std::string& name, const std::vector<json>& a, WorkBudget& work) {
  if (self.is_string()) return string_method(self.get_ref<const std::string&>(), name, a, work);
  if (self.is_object()) {
    if (name == "items") return items_of(self);
    json out = json::array();
    if (name == "keys" || name == "values") {
      for (auto it = self.begin(); it != self.end(); ++it) out.push_back(name == "keys" ? json(it.key()) : it.value());
      return out;
    }
    if (name == "get") {
      const json found = subscript(self, a.empty() ? undefined() : a[0]);
      return !is_undefined(found) ? found : a.size() > 1 ? a[1] : json(nullptr);
    }
  }
  fail("unknown method '" + name + "' on " + (is_undefined(self) ? "undefined" : self.type_name()));
}

json length_of(const json& v) {
  if (v.is_string()) return v.get_ref<const std::string&>().size();
  if (v.is_array() || v.is_object()) return v.size();
  fail("length of a value without one");
}

// Python's int(text), 0 where the text is no number (as Jinja's int filter).
json parse_int(const std::string& text) {
  errno = 0;
  const long long value = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE) fail("int: " + text.substr(0, 40) + " is out of range");
  return static_cast<int64_t>(value);
}

// Hugging Face's tojson is Python's json.dumps: ", " and ": " between items,
// or one item per line with an indent, so that tools and tool-call arguments
// read as in the model's training data. (Keys come sorted: JSON objects here
// do not keep their order.) Each item costs kStepCost of work: a dump() and
// appends, slower than its bytes.
void python_json(const json& v, int indent, int level, std::string& out, WorkBudget& work) {
  if ((!v.is_array() && !v.is_object()) || v.empty()) {
    out += dump(v);
    return;
  }
  const std::string line_start = indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent * (level + 1)), ' ');
  out += v.is_array() ? '[' : '{';
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it != v.begin()) out += indent < 0 ? ", " : ",";
    out += line_start;
    if (v.is_object()) out += dump(it.key()) + ": ";
    work.charge(kStepCost);
    python_json(*it, indent, level + 1, out, work);
    check_text_size(out.size(), "tojson");
  }
  if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent * level), ' ');
  out += v.is_array() ? ']' : '}';
}

// Jinja's join over a string's characters, without a string per character.
std::string join_characters(const std::string& s, const json& separator) {
  const std::string sep = is_undefined(separator) ? "" : to_text(separator);
  if (s.empty()) return s;
  check_text_size(s.size() + (s.size() - 1) * sep.size(), "join");  // both at most 64 MiB: no overflow
  std::string out(s.size() + (s.size() - 1) * sep.size(), '\0');
  char* at = out.data();
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) at = std::copy(sep.begin(), sep.end(), at);
    *at++ = s[i];
  }
  return out;
}

json join(const json& items, const json& separator) {
  if (!items.is_array()) fail("join needs a list, got " + std::string(is_undefined(items) ? "undefined" : items.type_name()));
  const std::string sep = is_undefined(separator) ? "" : to_text(separator);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string item = to_text(items[i]);
    check_text_size(out.size() + sep.size() + item.size(), "join");
    if (i) out += sep;
    out += item;
  }
  return out;
}

json apply_filter(const std::string& name, const json& v, const std::vector<json>& a, WorkBudget& work) {
  auto arg = [&](size_t i) { return i < a.size() ? a[i] : undefined(); };
  if (name == "trim" || name == "strip") return strip(as_string(v, "trim"), true, true);
  if (name == "length" || name == "count") return length_of(v);
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title")
    return string_method(as_string(v, name.c_str()), name, {}, work);
  if (name == "string") return to_text(v);
  if (name == "safe") return v;
  if (name == "tojson") {
    const int64_t indent = is_undefined(arg(0)) ? -1 : as_int(arg(0), "tojson");
    if (indent > kMaxJsonIndent) fail("tojson indent must be at most " + std::to_string(kMaxJsonIndent));
    std::string out;  // Python: an indent of 0 or less breaks lines without indenting
    python_json(v, is_undefined(arg(0)) ? -1 : static_cast<int>(std::max<int64_t>(indent, 0)), 0, out, work);
    return out;
  }
  if (name == "default" || name == "d") return is_undefined(v) || (truthy(arg(1)) && !truthy(v)) ? arg(0) : v;
  if (name == "items") return items_of(v);
  if (name == "int") return v.is_string() ? parse_int(v.get<std::string>()) : json(as_int(v, "int"));
  if (name == "first" || name == "last") {
    if ((!v.is_array() && !v.is_string()) || length_of(v) == 0) return undefined();
    return subscript(v, name == "first" ? 0 : -1);
  }
  if (name == "reverse") return slice(v, undefined(), undefined(), -1);
  if (name == "list") return v.is_array() ? v : slice(v, undefined(), undefined(), 1);
  if (name == "join") return v.is_string() ? json(join_characters(v.get_ref<const std::string&>(), arg(0))) : join(v, arg(0));
  fail("unknown filter '" + name + "'");
}

bool apply_test(const std::string& name, const json& v) {
  if (name == "defined") return !is_undefined(v);
  if (name == "undefined") return is_undefined(v);
  if (name == "none") return v.is_null();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_number_integer();
  if (name == "float") return v.is_number_float();
  if (name == "boolean") return v.is_boolean();
  if (name == "true" || name == "false") return v.is_boolean() && v.get<bool>() == (name == "true");
  if (name == "mapping") return v.is_object();
  if (name == "sequence" || name == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (name == "even" || name == "odd") return v.is_number_integer() && (v.get<int64_t>() % 2 == 0) == (name == "even");
  fail("unknown test '" + name + "'");
}

// Bytes a value takes in memory, roughly (evaluating one copies it). Fails on
// values nested deeper than kMaxValueDepth, which would overflow the stack
// when copied, compared or printed (JSON values are recursive).
size_t footprint(const json& v, int depth) {
  if (depth > kMaxValueDepth) fail("a value nests lists or dicts more than " + std::to_string(kMaxValueDepth) + " deep");
  if (v.is_string()) return kValueBytes + kStringBytes + v.get_ref<const std::string&>().size();
  if (!v.is_array() && !v.is_object()) return kValueBytes;
  size_t bytes = kValueBytes + kStringBytes;
  for (auto it = v.begin(); it != v.end(); ++it)
    bytes += footprint(*it, depth + 1) + (v.is_object() ? kStringBytes + it.key().size() : 0);
  return bytes;
}

class Renderer {
 public:
  Renderer(json globals, size_t max_work_bytes) : work_(max_work_bytes) { scopes_.push_back(std::move(globals)); }

  std::string run(const std::vector<Node>& nodes) {
    exec(nodes);
    return std::move(out_);
  }

 private:
  void exec(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) {
      work_.charge(kStepCost);
      switch (n.kind) {
        case Node::Kind::kText: emit(n.text); break;
        case Node::Kind::kOutput: emit(to_text(eval(*n.expr))); break;
        case Node::Kind::kIf: exec_if(n); break;
        case Node::Kind::kFor: exec_for(n); break;
        case Node::Kind::kSet: exec_set(n); break;
      }
    }
  }

  void emit(const std::string& text) {
    if (out_.size() + text.size() > kMaxTextBytes)
      fail("the output would exceed " + std::to_string(kMaxTextBytes >> 20) + " MiB");
    out_ += text;
  }

  // Every loop iteration (and range() item) counts against one budget, so
  // nested loops cannot multiply into hours.
  void count_iterations(int64_t n) {
    iterations_ += n;
    if (iterations_ > kMaxLoopIterations)
      fail("loops ran more than " + std::to_string(kMaxLoopIterations) + " iterations in all");
  }

  // Fails before a loop of `count` more iterations starts (or its items are made).
  void check_iterations(size_t count) const {
    if (count > static_cast<size_t>(kMaxLoopIterations - iterations_))
      fail("loops ran more than " + std::to_string(kMaxLoopIterations) + " iterations in all");
  }

  // Charges a value just produced against the work budget: every evaluation
  // copies its result, so a loop over a large value costs its size each time.
  void account(const json& v) { work_.charge(kStepCost + footprint(v, 0)); }

  void exec_if(const Node& n) {
    for (size_t i = 0; i < n.bodies.size(); ++i) {
      if (i == n.conditions.size() || truthy(eval(*n.conditions[i]))) {
        exec(n.bodies[i]);
        return;
      }
    }
  }

  // The items a {% for %} visits, counted against the loop limit before they
  // are made: a string of 64 MiB would otherwise become 64 M strings first.
  std::vector<json> iteration_items(const Node& n) {
    const json seq = eval(*n.expr);
    if (!seq.is_structured() && !seq.is_string() && !is_undefined(seq) && !seq.is_null())
      fail("cannot loop over a " + std::string(seq.type_name()));
    const size_t count = seq.is_string() ? seq.get_ref<const std::string&>().size() : seq.is_structured() ? seq.size() : 0;
    check_iterations(count);
    std::vector<json> all;
    all.reserve(count);
    if (seq.is_object()) for (auto it = seq.begin(); it != seq.end(); ++it) all.push_back(it.key());
    else if (seq.is_array()) all.assign(seq.begin(), seq.end());
    else if (seq.is_string()) {
      work_.charge(count * (kStepCost + kValueBytes + kStringBytes));
      for (char c : seq.get_ref<const std::string&>()) all.push_back(std::string(1, c));
    }
    if (!n.conditions[0]) return all;
    std::vector<json> kept;
    count_iterations(static_cast<int64_t>(all.size()));
    for (json& item : all) {
      scopes_.push_back(json::object());
      bind_loop_variables(n, item);
      if (truthy(eval(*n.conditions[0]))) kept.push_back(std::move(item));
      scopes_.pop_back();
    }
    return kept;
  }

  void bind_loop_variables(const Node& n, const json& item) {
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != n.names.size()) fail("cannot unpack a loop item into " + std::to_string(n.names.size()) + " names");
    for (size_t i = 0; i < n.names.size(); ++i) scopes_.back()[n.names[i]] = item[i];
  }

  void exec_for(const Node& n) {
    const std::vector<json> items = iteration_items(n);
    const auto count = static_cast<int64_t>(items.size());
    count_iterations(count);
    for (int64_t i = 0; i < count; ++i) {
      scopes_.push_back(json::object());
      bind_loop_variables(n, items[static_cast<size_t>(i)]);
      scopes_.back()["loop"] = {{"index", i + 1}, {"index0", i}, {"first", i == 0}, {"last", i + 1 == count},
                                {"length", count}, {"revindex", count - i}, {"revindex0", count - i - 1}};
      exec(n.bodies[0]);
      scopes_.pop_back();
    }
    if (count == 0) exec(n.bodies[1]);
  }

  void exec_set(const Node& n) {
    json value = eval(*n.expr);
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = std::move(value);
      return;
    }
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      if (!scope->contains(n.names[0])) continue;
      json& target = (*scope)[n.names[0]];
      if (!target.is_object()) fail("cannot set an attribute of '" + n.names[0] + "'");
      target[n.names[1]] = std::move(value);
      account(target);  // ns.a = ns nests ns one level deeper each time
      return;
    }
    fail("'" + n.names[0] + "' is undefined");
  }

  json lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return *it;
    }
    return undefined();
  }

  json eval(const Expr& e) {
    json value = evaluate(e);
    account(value);
    return value;
  }

  json evaluate(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: {
        const json obj = eval(*e.args[0]);
        return obj.is_object() ? subscript(obj, e.name) : undefined();
      }
      case Expr::Kind::kIndex: return subscript(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice:
        return slice(eval(*e.args[0]), optional(e.args[1]), optional(e.args[2]), optional(e.args[3]));
      case Expr::Kind::kCall: return eval_call(e);
      case Expr::Kind::kFilter: return apply_filter(e.name, eval(*e.args[0]), eval_args(e), work_);
      case Expr::Kind::kTest: return apply_test(e.name, eval(*e.args[0]));
      case Expr::Kind::kNot: return !truthy(eval(*e.args[0]));
      case Expr::Kind::kNeg: return arithmetic("-", 0, eval(*e.args[0]));
      case Expr::Kind::kBinary: return eval_binary(e);
      case Expr::Kind::kList: return eval_list(e);
      case Expr::Kind::kDict: return eval_dict(e);
      case Expr::Kind::kIf:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : undefined();
    }
    fail("unknown expression");
  }

  json optional(const ExprPtr& e) { return e ? eval(*e) : undefined(); }

  json eval_list(const Expr& e) {
    json out = json::array();
    for (const ExprPtr& item : e.args) out.push_back(eval(*item));
    return out;
  }

  json eval_dict(const Expr& e) {
    json out = json::object();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) out[as_string(eval(*e.args[i]), "dict key")] = eval(*e.args[i + 1]);
    return out;
  }

  json eval_binary(const Expr& e) {
    const std::string& op = e.name;
    json left = eval(*e.args[0]);
    if (op == "and") return truthy(left) ? eval(*e.args[1]) : left;
    if (op == "or") return truthy(left) ? left : eval(*e.args[1]);
    const json right = eval(*e.args[1]);
    if (op == "~") {
      check_text_size(text_size(left) + text_size(right), "'~'");
      return to_text(left) + to_text(right);
    }
    if (op == "+" || op == "-" || op == "*" || op == "/" || op == "//" || op == "%") return arithmetic(op, left, right);
    return compare(op, left, right, work_);
  }

  // Arguments after the first (the callee or the filtered value).
  std::vector<json> eval_args(const Expr& e) {
    std::vector<json> out;
    for (size_t i = 1; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }

  json eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<json> args = eval_args(e);
    if (callee.kind == Expr::Kind::kAttr) return call_method(eval(*callee.args[0]), callee.name, args, work_);
    if (callee.kind != Expr::Kind::kName) fail("this value cannot be called");
    const std::string& fn = callee.name;
    if (fn == "raise_exception") fail(args.empty() ? "raise_exception()" : to_text(args[0]).substr(0, kMaxErrorBytes));
    if (fn == "namespace" || fn == "dict") {
      json out = json::object();
      for (size_t i = 0; i < args.size(); ++i)
        if (!e.keywords[i].empty()) out[e.keywords[i]] = args[i];
      return out;
    }
    if (fn == "range") return range(args);
    if (fn == "strftime_now") {
      char buf[128];
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      const std::string format = as_string(args.empty() ? undefined() : args[0], "strftime_now");  // a copy: the ?: is a temporary
      return std::string(buf, std::strftime(buf, sizeof buf, format.c_str(), &tm));
    }
    fail("unknown function '" + fn + "'");
  }

  static json range(const std::vector<json>& a) {
    if (a.empty() || a.size() > 2) fail("range takes one or two arguments");
    const int64_t from = a.size() == 2 ? as_int(a[0], "range") : 0, to = as_int(a.back(), "range");
    int64_t count = 0;
    if (__builtin_sub_overflow(to, from, &count) || count > kMaxLoopIterations)
      fail("range() of more than " + std::to_string(kMaxLoopIterations) + " numbers");
    json out = json::array();
    for (int64_t i = from; i < to; ++i) out.push_back(i);
    return out;
  }

  std::vector<json> scopes_;  // innermost last; every scope is a JSON object
  std::string out_;
  int64_t iterations_ = 0;  // loop iterations so far, against kMaxLoopIterations
  WorkBudget work_;
};

}  // namespace

ChatTemplate ChatTemplate::parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->source = std::string(source);
  program->nodes = parse_template(source);
  return ChatTemplate(std::move(program));
}

ChatTemplate ChatTemplate::chatml() { return parse(kChatMlSource); }

ChatTemplate ChatTemplate::gemma() { return parse(kGemmaSource); }

ChatTemplate ChatTemplate::for_model(const GGUFFile& file, std::string* note) {
  const std::string key = "tokenizer.chat_template";
  auto say = [&](const std::string& text) {
    if (note) *note = text;
  };
  if (!file.has(key)) {
    // A Gemma file without a template (the base models) still knows Gemma's
    // turn tokens; ChatML's would be plain text to it.
    if (file.get_string("general.architecture", "").starts_with("gemma")) {
      say("the model has no " + key + "; using Gemma's turn format");
      return gemma();
    }
    say("the model has no " + key + "; using ChatML");
    return chatml();
  }
  try {
    ChatTemplate t = parse(file.get_string(key));
    // A dry run catches templates that parse but use what apply() lacks.
    ChatTemplateInputs probe;
    probe.messages = json::array({{{"role", "user"}, {"content", "hello"}}});
    t.apply(probe);
    say("using the model's " + key);
    return t;
  } catch (const Error& e) {
    say(std::string("the model's ") + key + " is not supported (" + e.what() + "); using ChatML");
    return chatml();
  }
}

std::string ChatTemplate::apply(const ChatTemplateInputs& inputs) const {
  json globals = {{"messages", inputs.messages},
                  {"add_generation_prompt", inputs.add_generation_prompt},
                  {"bos_token", inputs.bos_token},
                  {"eos_token", inputs.eos_token},
                  {"tools", inputs.tools}};
  return Renderer(std::move(globals), inputs.max_work_bytes ? inputs.max_work_bytes : kMaxWorkBytes).run(program_->nodes);
}

const std::string& ChatTemplate::source() const { return program_->source; }

void set_special_tokens(ChatTemplateInputs& inputs, const Tokenizer& tokenizer) {
  inputs.bos_token = tokenizer.bos_id() >= 0 ? tokenizer.piece(tokenizer.bos_id()) : "";
  inputs.eos_token = tokenizer.eos_id() >= 0 ? tokenizer.piece(tokenizer.eos_id()) : "";
}

std::vector<int32_t> encode_rendered_prompt(const Tokenizer& tokenizer, const ChatTemplateInputs& inputs,
                                            const std::string& rendered) {
  const bool has_bos = !inputs.bos_token.empty() && rendered.rfind(inputs.bos_token, 0) == 0;
  return tokenizer.encode(rendered, tokenizer.add_bos() && !has_bos);
}

}  // namespace kvserve
