// Methods, filters and tests in chat templates (chat_template_filters.h).
#include "tokenizer/chat_template_filters.h"

#include <cerrno>
#include <cstdlib>

#include "tokenizer/text_search.h"

namespace kvserve::chat_template_detail {
namespace {

constexpr int kMaxJsonIndent = 16;  // tojson(indent)

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

}  // namespace

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

namespace {

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
    if (v.is_string()) work.charge(v.get_ref<const std::string&>().size());  // a 16 MiB string dumped 1000 times
    out += dump(v);
    return;
  }
  const std::string line_start = indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent * (level + 1)), ' ');
  out += v.is_array() ? '[' : '{';
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it != v.begin()) out += indent < 0 ? ", " : ",";
    out += line_start;
    if (v.is_object()) {
      work.charge(it.key().size());
      out += dump(it.key()) + ": ";
    }
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

}  // namespace

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

}  // namespace kvserve::chat_template_detail
