#pragma once
// Linear scans of JSON text from outside, run before parsing it with
// nlohmann::json, whose parse callback (the usual way to bound depth) is
// quadratic: it rescans the enclosing object at the end of each member
// object. A few MiB of {"k0": {}, "k1": {}, ...} took minutes.
#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kvserve {

// Calls on_open(is_object) / on_close(is_object, members) for each bracket, strings skipped.
template <class Open, class Close>
void scan_json_brackets(std::string_view text, Open on_open, Close on_close) {
  std::vector<std::pair<bool, int64_t>> open;  // per open bracket: an object?, its commas
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (c == '[' || c == '{') {
      open.emplace_back(c == '{', 0);
      on_open(open.size());
    } else if (c == ',' && !open.empty()) {
      ++open.back().second;
    } else if ((c == ']' || c == '}') && !open.empty()) {
      on_close(open.back().first, open.back().second + 1);
      open.pop_back();
    }
  }
}

// How deep the brackets nest.
inline int64_t json_nesting_depth(std::string_view text) {
  size_t deepest = 0;
  scan_json_brackets(text, [&](size_t depth) { deepest = std::max(deepest, depth); }, [](bool, int64_t) {});
  return static_cast<int64_t>(deepest);
}

// Brackets outside strings, a byte at a time (the state carries from one
// piece of a text to the next: tool calls found as model output streams).
struct JsonBrackets {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  // Takes the next byte: true when it is part of a string (its quotes
  // included); else the depth follows the byte's bracket, if it is one.
  bool take(char c) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      return true;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    return c == '"';
  }
};

}  // namespace kvserve
