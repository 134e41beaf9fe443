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
constexpr std::string_view kCallIdPrefix = "call_";
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
  JsonBrackets brackets;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (brackets.take(c)) continue;
    if ((c == '{' || c == '[') && brackets.depth > kMaxCallDepth) return {JsonExtent::kTooDeep, i};
    if ((c == '}' || c == ']') && brackets.depth == 0) return {JsonExtent::kClosed, i + 1};
  }
  return {JsonExtent::kOpen, text.size()};
}

// A JSON string at text[0]: its value and its length in the text.
Match json_string_at(std::string_view text, std::string* value, size_t* length) {
  if (text.empty()) return Match::kPartial;
  if (text[0] != '"') return Match::kNo;
  bool escaped = false;
  for (size_t i = 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      escaped = true;
      ++i;
    } else if (text[i] == '"') {
      if (!escaped) {  // the common case, asked again at every piece while a call opens: no parse
        value->assign(text.substr(1, i - 1));
        *length = i + 1;
        return Match::kFull;
      }
      const std::optional<json> parsed = parse_bounded_json<json>(text.substr(0, i + 1));
      if (!parsed || !parsed->is_string()) return Match::kNo;
      *value = parsed->get<std::string>();
      *length = i + 1;
      return Match::kFull;
    }
  }
  return Match::kPartial;
}

// {"name": "...", "arguments": { (or "parameters") at text[0], whitespace
// allowed between: the name and where the arguments' brace is.
Match streamed_call_prefix(std::string_view text, std::string* name, size_t* arguments_at) {
  size_t i = 0;
  const auto word = [&](std::string_view w) {
    while (i < text.size() && is_space(text[i])) ++i;
    const Match m = match_word(text.substr(i), w);
    if (m == Match::kFull) i += w.size();
    return m;
  };
  for (std::string_view w : {"{", "\"name\"", ":"})
    if (const Match m = word(w); m != Match::kFull) return m;
  while (i < text.size() && is_space(text[i])) ++i;
  size_t length = 0;
  if (const Match m = json_string_at(text.substr(i), name, &length); m != Match::kFull) return m;
  i += length;
  if (const Match m = word(","); m != Match::kFull) return m;
  const size_t key_at = i;
  if (word("\"arguments\"") != Match::kFull) {
    i = key_at;
    const Match other = word("\"parameters\"");
    if (other != Match::kFull) {
      i = key_at;
      return word("\"arguments\"") == Match::kPartial || other == Match::kPartial ? Match::kPartial : Match::kNo;
    }
  }
  if (const Match m = word(":"); m != Match::kFull) return m;
  while (i < text.size() && is_space(text[i])) ++i;
  if (i == text.size()) return Match::kPartial;
  if (text[i] != '{') return Match::kNo;
  *arguments_at = i;
  return Match::kFull;
}

std::string new_call_id() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id(kCallIdPrefix);
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

std::string call_id_as(std::string_view prefix, const std::string& call_id) {
  const size_t own = call_id.starts_with(kCallIdPrefix) ? kCallIdPrefix.size() : 0;
  return std::string(prefix) + call_id.substr(own);
}

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
  while (settled < text_.size() || (complete && open_)) {
    const std::string_view rest = std::string_view(text_).substr(settled);
    const std::optional<size_t> step = open_      ? open_call_step(rest, complete, out)
                                       : leading_ ? leading_step(rest, complete, out)
                                                  : content_step(rest, complete, out);
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
  out.calls.push_back({calls_++, std::move(call.id), std::move(call.name), std::move(call.arguments), true, true});
}

std::optional<size_t> ToolCallStream::open_call(std::string_view rest, bool hermes, bool complete, Delta& out) {
  size_t at = 0;
  if (hermes)
    for (at = kHermesOpen.size(); at < rest.size() && is_space(rest[at]);) ++at;
  std::string name;
  size_t arguments_at = 0;
  const Match match = streamed_call_prefix(rest.substr(at), &name, &arguments_at);
  if (match == Match::kPartial && !complete) return std::nullopt;
  if (match != Match::kFull || std::find(names_.begin(), names_.end(), name) == names_.end()) return 0;
  OpenCall call;
  call.index = calls_;
  call.hermes = hermes;
  call.kept = parallel_ || calls_ == 0;  // the client asked for one call at most
  if (call.kept) out.calls.push_back({calls_++, new_call_id(), std::move(name), "", true, false});
  open_ = call;
  return at + arguments_at;
}

// The open call's arguments as they come (whitespace outside strings
// dropped), then the rest of its object (other keys are skipped), then its
// closing tag; the output's end closes it wherever it is.
std::optional<size_t> ToolCallStream::open_call_step(std::string_view rest, bool complete, Delta& out) {
  OpenCall& call = *open_;
  std::string arguments;
  bool closed = false;
  size_t i = 0;
  while (i < rest.size() && !closed && call.stage != OpenCall::Stage::kClosingTag) {
    const char c = rest[i++];
    const bool in_arguments = call.stage == OpenCall::Stage::kArguments;
    if (call.brackets.take(c)) {
      if (in_arguments) arguments += c;
      continue;
    }
    if (is_space(c)) continue;
    if (c == '<' && call.hermes) {  // the closing tag outside a string ends the call, closed or not
      const Match tag = match_word(rest.substr(i - 1), kHermesClose);
      if (tag == Match::kPartial && !complete) {
        --i;
        break;
      }
      if (tag == Match::kFull) {
        i += kHermesClose.size() - 1;
        closed = true;
        break;
      }
    }
    if (in_arguments) arguments += c;
    if ((c == '}' || c == ']') && call.brackets.depth <= 0) {
      if (in_arguments) {
        call.stage = OpenCall::Stage::kCallObject;
        call.brackets.depth = 1;  // the call object's own brace
      } else if (call.hermes) {
        call.stage = OpenCall::Stage::kClosingTag;
      } else {
        closed = true;
      }
    }
  }
  if (call.stage == OpenCall::Stage::kClosingTag) {
    while (i < rest.size() && is_space(rest[i])) ++i;
    const Match tag = match_word(rest.substr(i), kHermesClose);
    if (tag == Match::kFull) i += kHermesClose.size();
    closed = tag != Match::kPartial || complete;  // anything else after the object ends the call
  }
  closed = closed || complete;
  if (call.kept && (!arguments.empty() || closed)) out.calls.push_back({call.index, "", "", std::move(arguments), false, closed});
  if (closed) open_.reset();
  if (i == 0 && !closed) return std::nullopt;
  return i;
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
  if (at[0] == '{') {
    const std::optional<size_t> opened = open_call(at, false, complete, out);
    if (!opened) return std::nullopt;
    if (*opened > 0) return start + *opened;
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
    if (from[0] != '`') {
      const std::optional<size_t> opened = open_call(rest, from[0] == '<', complete, out);
      if (!opened || *opened > 0) return opened;
    }
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

void add_call_pieces(std::vector<ToolCall>& calls, const std::vector<ToolCallDelta>& pieces) {
  for (const ToolCallDelta& piece : pieces) {
    if (piece.first) calls.push_back({piece.id, piece.name, piece.arguments});
    else if (piece.index < calls.size()) calls[piece.index].arguments += piece.arguments;
  }
}

ParsedToolOutput parse_tool_calls(std::string_view text, ToolCallFormat format, const ToolRequest& tools) {
  ToolCallStream stream(format, tools);
  ToolCallStream::Delta first = stream.feed(text);
  ToolCallStream::Delta rest = stream.finish();
  ParsedToolOutput out{std::move(first.content) + rest.content, {}};
  add_call_pieces(out.calls, first.calls);
  add_call_pieces(out.calls, rest.calls);
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
