// Values in chat templates: truthiness, text, numbers, operators, subscripts
// and slices (chat_template_values.h).
#include "tokenizer/chat_template_values.h"

#include <cmath>

#include "tokenizer/text_search.h"

namespace kvserve::chat_template_detail {
namespace {

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

}  // namespace

bool truthy(const json& v) {
  if (is_undefined(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

// Fails before a string of `bytes` is built.
void check_text_size(size_t bytes, const char* what) {
  if (bytes > kMaxTextBytes)
    fail(std::string(what) + " would make a string of more than " + std::to_string(kMaxTextBytes >> 20) + " MiB");
}

// Template strings may hold any bytes; JSON text replaces invalid UTF-8.
std::string dump(const json& v, int indent) {
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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

// Python-style index: negative counts from the end; returns false when out of range.
bool normalize_index(int64_t& i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  return i >= 0 && i < static_cast<int64_t>(size);
}

}  // namespace

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

namespace {

// s[from:to:by] with bounds already clamped into range.
std::string slice_text(const std::string& s, int64_t from, int64_t to, int64_t by) {
  if (by == 1) return from < to ? s.substr(static_cast<size_t>(from), static_cast<size_t>(to - from)) : "";
  if (by == -1) return from > to ? std::string(s.rbegin() + (static_cast<int64_t>(s.size()) - 1 - from), s.rend() - (to + 1)) : "";
  const int64_t count = by > 0 ? (to - from + by - 1) / by : (from - to - by - 1) / -by;
  std::string out(static_cast<size_t>(std::max<int64_t>(0, count)), '\0');
  for (size_t k = 0; k < out.size(); ++k) out[k] = s[static_cast<size_t>(from + static_cast<int64_t>(k) * by)];
  return out;
}

}  // namespace

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

}  // namespace kvserve::chat_template_detail
