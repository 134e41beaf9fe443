#include "server/tool_calls.h"

#include <algorithm>
#include <random>

namespace kvserve::server {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;  // arguments keep the model's key order

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kJsonTrigger = "{\"name\"";
constexpr std::string_view kSpace = " \t\n\r";
constexpr size_t kCallIdChars = 24;
// Calls nest no deeper than request bodies may (parsing and printing JSON recurse).
constexpr int kMaxCallDepth = 64;

// The longest suffix of text that is a proper prefix of word: text that may
// still turn into word once more arrives.
size_t partial_suffix(std::string_view text, std::string_view word) {
  for (size_t n = std::min(text.size(), word.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == word.substr(0, n)) return n;
  return 0;
}

// Where the JSON object or list opening at text[0] ends (one past its closing
// bracket). Counts brackets outside strings, so it decides as the text comes.
struct JsonExtent {
  enum Kind { kOpen, kClosed, kTooDeep } kind;
  size_t end = 0;
};

JsonExtent json_extent(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxCallDepth) return {JsonExtent::kTooDeep, i};
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return {JsonExtent::kClosed, i + 1};
    }
  }
  return {JsonExtent::kOpen, text.size()};
}

std::string new_call_id() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id = "call_";
  for (size_t i = 0; i < kCallIdChars; ++i) id += kAlphabet[pick(rng)];
  return id;
}

// The arguments of a call as a compact JSON object: given as an object, as a
// string holding one (some models quote them), or absent (no arguments).
std::optional<std::string> arguments_of(const ordered_json& call, const char* key, const char* other_key) {
  auto it = call.find(key);
  if (it == call.end()) it = call.find(other_key);
  if (it == call.end() || it->is_null()) return "{}";
  if (it->is_object()) return it->dump(-1, ' ', false, json::error_handler_t::replace);
  if (!it->is_string()) return std::nullopt;
  const ordered_json parsed = ordered_json::parse(it->get<std::string>(), nullptr, false);
  if (!parsed.is_object()) return std::nullopt;
  return parsed.dump(-1, ' ', false, json::error_handler_t::replace);
}

json schema_or_empty_object(const json& parameters) {
  return parameters.is_object() ? parameters : json{{"type", "object"}, {"properties", json::object()}};
}

// The text before a call's arguments object and after it.
std::pair<std::string, std::string> call_frame(const std::string& name, ToolCallFormat format) {
  const char* arguments_key = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  const std::string begin = "{\"name\": " + json(name).dump() + ", \"" + arguments_key + "\": ";
  if (format != ToolCallFormat::kHermes) return {begin, "}"};
  return {std::string(kHermesOpen) + "\n" + begin, "}\n" + std::string(kHermesClose)};
}

}  // namespace

ToolCallFormat tool_call_format_for(const std::string& source) {
  if (source.find(kHermesOpen) != std::string::npos) return ToolCallFormat::kHermes;
  const bool llama3 = source.find(kPythonTag) != std::string::npos ||
                      (source.find("tools") != std::string::npos && source.find("\"parameters\"") != std::string::npos);
  return llama3 ? ToolCallFormat::kLlama3Json : ToolCallFormat::kGenericJson;
}

ToolCallStream::ToolCallStream(ToolCallFormat format, const ToolRequest& tools)
    : format_(format), parallel_(tools.parallel_tool_calls) {
  for (const ToolDefinition& tool : tools.tools) names_.push_back(tool.name);
}

ToolCallStream::Delta ToolCallStream::feed(std::string_view text) {
  Delta out;
  text_.append(text);
  settle(false, out);
  return out;
}

ToolCallStream::Delta ToolCallStream::finish() {
  Delta out;
  settle(true, out);
  held_space_.clear();  // trailing whitespace of the content
  return out;
}

void ToolCallStream::settle(bool complete, Delta& out) {
  size_t settled = 0;
  while (settled < text_.size()) {
    const std::string_view rest = std::string_view(text_).substr(settled);
    const std::optional<size_t> step = format_ == ToolCallFormat::kHermes ? hermes_step(rest, complete, out)
                                       : leading_                         ? leading_json_step(rest, complete, out)
                                                                          : content_json_step(rest, complete, out);
    if (!step) break;
    settled += *step;
  }
  text_.erase(0, settled);
}

// Content (trimmed at both ends of the whole output) goes out as it settles,
// except whitespace that could still turn out to be trailing.
void ToolCallStream::add_content(std::string_view text, Delta& out) {
  if (!content_started_) {
    const size_t first = text.find_first_not_of(kSpace);
    if (first == std::string_view::npos) return;
    text.remove_prefix(first);
    content_started_ = true;
  }
  const size_t last = text.find_last_not_of(kSpace);
  if (last == std::string_view::npos) {
    held_space_.append(text);
    return;
  }
  out.content += held_space_;
  out.content.append(text.substr(0, last + 1));
  held_space_.assign(text.substr(last + 1));
}

void ToolCallStream::add_call(ToolCall call, Delta& out) {
  if (!parallel_ && calls_ > 0) return;  // the client asked for one call at most
  ++calls_;
  out.calls.push_back(std::move(call));
}

std::optional<std::vector<ToolCall>> ToolCallStream::calls_in(std::string_view json_text, bool list_allowed) const {
  const ordered_json value = ordered_json::parse(json_text, nullptr, false);
  const bool list = list_allowed && value.is_array() && !value.empty();
  if (!value.is_object() && !list) return std::nullopt;
  const bool llama3 = format_ == ToolCallFormat::kLlama3Json;
  std::vector<ToolCall> calls;
  for (const ordered_json& item : list ? value : ordered_json::array({value})) {
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) return std::nullopt;
    const std::string name = item["name"].get<std::string>();
    if (std::find(names_.begin(), names_.end(), name) == names_.end()) return std::nullopt;
    std::optional<std::string> arguments =
        arguments_of(item, llama3 ? "parameters" : "arguments", llama3 ? "arguments" : "parameters");
    if (!arguments) return std::nullopt;
    calls.push_back({new_call_id(), name, std::move(*arguments)});
  }
  return calls;
}

// Calls anywhere in the text, each inside <tool_call> ... </tool_call>.
std::optional<size_t> ToolCallStream::hermes_step(std::string_view rest, bool complete, Delta& out) {
  const size_t open = rest.find(kHermesOpen);
  if (open == std::string_view::npos) {
    const size_t n = complete ? rest.size() : rest.size() - partial_suffix(rest, kHermesOpen);
    if (n == 0) return std::nullopt;
    add_content(rest.substr(0, n), out);
    return n;
  }
  if (open > 0) {
    add_content(rest.substr(0, open), out);
    return open;
  }
  const size_t close = rest.find(kHermesClose, kHermesOpen.size());
  if (close == std::string_view::npos && !complete) return std::nullopt;
  // An output that ends inside the call (no closing tag) still counts when its JSON is whole.
  const size_t end = close == std::string_view::npos ? rest.size() : close + kHermesClose.size();
  const std::string_view body = rest.substr(kHermesOpen.size(), std::min(close, rest.size()) - kHermesOpen.size());
  if (std::optional<std::vector<ToolCall>> calls = calls_in(body, false)) add_call(std::move(calls->front()), out);
  else add_content(rest.substr(0, end), out);
  return end;
}

// At the start of a JSON-format output: calls (an object or a list), one
// after another, maybe behind <|python_tag|>; anything else starts the content.
std::optional<size_t> ToolCallStream::leading_json_step(std::string_view rest, bool complete, Delta& out) {
  const size_t start = rest.find_first_not_of(kSpace);
  if (start == std::string_view::npos) return complete ? std::optional<size_t>(rest.size()) : std::nullopt;
  const std::string_view at = rest.substr(start);
  if (at.starts_with(kPythonTag)) return start + kPythonTag.size();
  if (at.size() < kPythonTag.size() && kPythonTag.starts_with(at) && !complete) return std::nullopt;
  if (calls_ > 0 && at[0] == ';') return start + 1;  // Llama 3 separates calls with ';'
  if (at[0] != '{' && at[0] != '[') {
    leading_ = false;
    return 0;
  }
  const JsonExtent extent = json_extent(at);
  if (extent.kind == JsonExtent::kOpen && !complete) return std::nullopt;
  if (extent.kind == JsonExtent::kClosed) {
    if (std::optional<std::vector<ToolCall>> calls = calls_in(at.substr(0, extent.end), true)) {
      for (ToolCall& call : *calls) add_call(std::move(call), out);
      return start + extent.end;
    }
  }
  leading_ = false;  // not a call: the output is text from here (a later {"name" may still be one)
  const size_t end = extent.kind == JsonExtent::kClosed ? start + extent.end
                     : extent.kind == JsonExtent::kOpen ? rest.size()
                                                        : start + 1;
  add_content(rest.substr(0, end), out);
  return end;
}

// Within text: a call is an object that opens with {"name".
std::optional<size_t> ToolCallStream::content_json_step(std::string_view rest, bool complete, Delta& out) {
  const size_t open = rest.find(kJsonTrigger);
  if (open == std::string_view::npos) {
    const size_t n = complete ? rest.size() : rest.size() - partial_suffix(rest, kJsonTrigger);
    if (n == 0) return std::nullopt;
    add_content(rest.substr(0, n), out);
    return n;
  }
  if (open > 0) {
    add_content(rest.substr(0, open), out);
    return open;
  }
  const JsonExtent extent = json_extent(rest);
  if (extent.kind == JsonExtent::kOpen && !complete) return std::nullopt;
  if (extent.kind == JsonExtent::kClosed) {
    if (std::optional<std::vector<ToolCall>> calls = calls_in(rest.substr(0, extent.end), false)) {
      add_call(std::move(calls->front()), out);
      return extent.end;
    }
  }
  // Not a call: its text is content (a too-deep one only its first brace, then the search goes on).
  const size_t end = extent.kind == JsonExtent::kClosed ? extent.end : extent.kind == JsonExtent::kOpen ? rest.size() : 1;
  add_content(rest.substr(0, end), out);
  return end;
}

ParsedToolOutput parse_tool_calls(std::string_view text, ToolCallFormat format, const ToolRequest& tools) {
  ToolCallStream stream(format, tools);
  ToolCallStream::Delta first = stream.feed(text);
  ToolCallStream::Delta rest = stream.finish();
  ParsedToolOutput out{std::move(first.content) + rest.content, std::move(first.calls)};
  for (ToolCall& call : rest.calls) out.calls.push_back(std::move(call));
  return out;
}

std::vector<ToolCallShape> tool_call_shapes(const ToolRequest& tools, ToolCallFormat format) {
  std::vector<ToolCallShape> out;
  for (const ToolDefinition& tool : tools.tools) {
    if (tools.choice.kind == ToolChoice::kNamed && tool.name != tools.choice.name) continue;
    auto [begin, end] = call_frame(tool.name, format);
    out.push_back({std::move(begin), schema_or_empty_object(tool.parameters), std::move(end)});
  }
  return out;
}

std::string tool_call_text(const std::string& name, const std::string& arguments, ToolCallFormat format) {
  const auto [begin, end] = call_frame(name, format);
  return begin + arguments + end;
}

std::vector<std::string> tool_call_triggers(ToolCallFormat format) {
  return {std::string(format == ToolCallFormat::kHermes ? kHermesOpen : kJsonTrigger)};
}

}  // namespace kvserve::server
