#include "server/tool_calls.h"

#include <algorithm>
#include <random>

#include "server/json_input.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;  // arguments keep the model's key order

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kJsonTrigger = "{\"name\"";
constexpr std::string_view kFence = "```";
constexpr std::string_view kSpace = " \t\n\r";
constexpr size_t kCallIdChars = 24;
// Calls nest no deeper than request bodies may (parsing and printing JSON recurse).
constexpr int kMaxCallDepth = 64;

bool is_space(char c) { return kSpace.find(c) != std::string_view::npos; }

// Whether an opener starts at text[0]: surely, not, or not known yet (the
// text ends inside what could still be one).
enum class Match { kNo, kPartial, kFull };

Match match_word(std::string_view text, std::string_view word) {
  const size_t n = std::min(text.size(), word.size());
  if (text.substr(0, n) != word.substr(0, n)) return Match::kNo;
  return n == word.size() ? Match::kFull : Match::kPartial;
}

// {"name", whitespace allowed after the brace.
Match json_opener(std::string_view text) {
  size_t i = 1;
  while (i < text.size() && is_space(text[i])) ++i;
  return i == text.size() ? Match::kPartial : match_word(text.substr(i), "\"name\"");
}

// ``` or ```json, then whitespace and a JSON object or list (whose offset goes to *body).
Match fence_opener(std::string_view text, size_t* body) {
  if (const Match fence = match_word(text, kFence); fence != Match::kFull) return fence;
  size_t i = kFence.size();
  const Match language = match_word(text.substr(i), "json");
  if (language == Match::kPartial) return Match::kPartial;
  if (language == Match::kFull) i += 4;
  while (i < text.size() && is_space(text[i])) ++i;
  if (i == text.size()) return Match::kPartial;
  *body = i;
  return text[i] == '{' || text[i] == '[' ? Match::kFull : Match::kNo;
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
  const std::optional<ordered_json> parsed = parse_bounded_json<ordered_json>(it->get<std::string>());
  if (!parsed || !parsed->is_object()) return std::nullopt;
  return parsed->dump(-1, ' ', false, json::error_handler_t::replace);
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
    const std::optional<size_t> step = leading_ ? leading_step(rest, complete, out) : content_step(rest, complete, out);
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
  // Model output: a deeply nested "call" stays text rather than being walked.
  const ordered_json value = parse_bounded_json<ordered_json>(json_text).value_or(ordered_json());
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

// At the start of the output: calls written as JSON (an object or a list,
// several one after another, maybe behind <|python_tag|>); anything else
// starts the content.
std::optional<size_t> ToolCallStream::leading_step(std::string_view rest, bool complete, Delta& out) {
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
  leading_ = false;  // not a call: the output is text from here (a later opener may still start one)
  const size_t end = extent.kind == JsonExtent::kClosed ? start + extent.end
                     : extent.kind == JsonExtent::kOpen ? rest.size()
                                                        : start + 1;
  add_content(rest.substr(0, end), out);
  return end;
}

// Within text: a call opens with <tool_call> (Hermes), with {"name" or with a
// ```json fence around calls. Text that may still become an opener is held back.
std::optional<size_t> ToolCallStream::content_step(std::string_view rest, bool complete, Delta& out) {
  const std::string_view candidates = format_ == ToolCallFormat::kHermes ? "<{`" : "{`";
  for (size_t at = rest.find_first_of(candidates); at != std::string_view::npos; at = rest.find_first_of(candidates, at + 1)) {
    const std::string_view from = rest.substr(at);
    size_t body = 0;
    const Match match = from[0] == '<' ? match_word(from, kHermesOpen)
                        : from[0] == '{' ? json_opener(from)
                                         : fence_opener(from, &body);
    if (match == Match::kNo || (match == Match::kPartial && complete)) continue;
    if (at > 0) {
      add_content(rest.substr(0, at), out);
      return at;
    }
    if (match == Match::kPartial) return std::nullopt;
    if (from[0] == '<') return tagged_call_step(rest, complete, out);
    return from[0] == '{' ? json_call_step(rest, complete, out) : fenced_call_step(rest, body, complete, out);
  }
  if (rest.empty()) return std::nullopt;
  add_content(rest, out);
  return rest.size();
}

// <tool_call> JSON </tool_call>; an output that ends inside the call (no
// closing tag) still has it when its JSON is whole.
std::optional<size_t> ToolCallStream::tagged_call_step(std::string_view rest, bool complete, Delta& out) {
  const size_t close = rest.find(kHermesClose, kHermesOpen.size());
  if (close == std::string_view::npos && !complete) return std::nullopt;
  const size_t end = close == std::string_view::npos ? rest.size() : close + kHermesClose.size();
  const std::string_view body = rest.substr(kHermesOpen.size(), std::min(close, rest.size()) - kHermesOpen.size());
  if (std::optional<std::vector<ToolCall>> calls = calls_in(body, false)) add_call(std::move(calls->front()), out);
  else add_content(rest.substr(0, end), out);
  return end;
}

// ```json, calls as JSON, ```: the fence goes with the calls (a missing
// closing fence at the end of the output too). Not calls: the ``` is text.
std::optional<size_t> ToolCallStream::fenced_call_step(std::string_view rest, size_t body, bool complete, Delta& out) {
  const JsonExtent extent = json_extent(rest.substr(body));
  if (extent.kind == JsonExtent::kOpen && !complete) return std::nullopt;
  if (extent.kind == JsonExtent::kClosed) {
    size_t end = body + extent.end;
    while (end < rest.size() && is_space(rest[end])) ++end;
    const Match close = match_word(rest.substr(end), kFence);
    if (close == Match::kPartial && !complete) return std::nullopt;
    const bool closed = close == Match::kFull || end == rest.size();
    if (closed) {
      if (std::optional<std::vector<ToolCall>> calls = calls_in(rest.substr(body, extent.end), true)) {
        for (ToolCall& call : *calls) add_call(std::move(call), out);
        return close == Match::kFull ? end + kFence.size() : end;
      }
    }
  }
  add_content(rest.substr(0, kFence.size()), out);
  return kFence.size();
}

// {"name": ..., "arguments": ...} up to its closing brace.
std::optional<size_t> ToolCallStream::json_call_step(std::string_view rest, bool complete, Delta& out) {
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
