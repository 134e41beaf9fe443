#pragma once
// Tool calls in model output: which format a model family writes them in,
// finding them in a finished text or in a stream of text deltas, and the
// shape of one call (what a grammar constrains the output to).
//
// Formats, chosen from the chat template:
//   kHermes      Qwen2.5 / Hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, anywhere in the text
//   kLlama3Json  Llama 3.x: a JSON object {"name": ..., "parameters": {...}} (after an optional <|python_tag|>)
//   kGenericJson templates that know no tools: {"name": ..., "arguments": {...}}, or a list of them
// Every format also takes calls written as bare JSON: at the start of the
// output (an object, a list of objects, or objects one after another, ';'
// between them allowed), anywhere later where an object opens with {"name"
// (a grammar's trigger) and inside a ```json fence. Small Qwen2.5 models
// answer so rather than with <tool_call> tags.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_scan.h"
#include "server/tool_request.h"

namespace kvserve::server {

enum class ToolCallFormat { kHermes, kLlama3Json, kGenericJson };

// kHermes for templates that write <tool_call> tags (Qwen2.5, Hermes),
// kLlama3Json for Llama 3.x's (<|python_tag|>, "parameters"), else kGenericJson.
ToolCallFormat tool_call_format_for(const std::string& chat_template_source);

struct ToolCall {
  std::string id;         // "call_" + 24 random alphanumerics, as OpenAI's
  std::string name;
  std::string arguments;  // a JSON object, compact, keys in the model's order
};

// A call id under another API's prefix ("toolu_" for Anthropic's tool_use
// ids, "fc_" for a Responses function_call item): "call_" replaced, the
// random characters kept.
std::string call_id_as(std::string_view prefix, const std::string& call_id);

// A piece of a call as it streams: the first piece names it (id, name), the
// next ones add bytes of its arguments, the last closes it. A call found
// whole comes as one piece, first and last.
struct ToolCallDelta {
  size_t index = 0;       // the call's place among the choice's calls
  std::string id;         // on the first piece
  std::string name;       // on the first piece
  std::string arguments;  // the next bytes of the arguments JSON
  bool first = false;
  bool last = false;
};

// Adds streamed pieces to whole calls (a first piece starts one, the others extend calls[index]).
void add_call_pieces(std::vector<ToolCall>& calls, const std::vector<ToolCallDelta>& pieces);

struct ParsedToolOutput {
  std::string content;  // the text outside the calls, trimmed; "" means none (the response's content is null)
  std::vector<ToolCall> calls;
};

// The calls in a finished output. A call whose name is not one of the tools,
// or whose JSON does not parse, stays in the content. With
// parallel_tool_calls false only the first call is kept.
ParsedToolOutput parse_tool_calls(std::string_view text, ToolCallFormat format, const ToolRequest& tools);

// The same parse over text that arrives in pieces: content passes straight
// through except what could still become a call (a prefix of the opener, an
// unclosed call) and whitespace that could end up trailing. A call written as
// {"name": "<a tool>", "arguments": {...}} (behind <tool_call> or not; Llama
// 3's "parameters" too) streams: its first piece once the name and the
// arguments' opening brace are known, then its arguments as they come
// (whitespace outside strings dropped), closed when its object closes (or the
// output ends). Other calls (a list, arguments before the name or as a
// string, a fence) come out whole once they close. The content and calls of
// every feed() and finish() together equal parse_tool_calls() of the whole
// text (ids aside).
class ToolCallStream {
 public:
  ToolCallStream(ToolCallFormat format, const ToolRequest& tools);

  struct Delta {
    std::string content;
    std::vector<ToolCallDelta> calls;
  };
  Delta feed(std::string_view text);
  Delta finish();  // the text is complete: settles what was held back
  size_t calls_so_far() const { return calls_; }

 private:
  void settle(bool complete, Delta& out);
  void add_content(std::string_view text, Delta& out);
  void add_call(ToolCall call, Delta& out);

  // One step of settle(): the bytes of text_ it settled (0 when only the
  // mode changed), or nullopt to wait for more text.
  std::optional<size_t> leading_step(std::string_view rest, bool complete, Delta& out);
  std::optional<size_t> content_step(std::string_view rest, bool complete, Delta& out);
  std::optional<size_t> tagged_call_step(std::string_view rest, bool complete, Delta& out);
  std::optional<size_t> json_call_step(std::string_view rest, bool complete, Delta& out);
  std::optional<size_t> fenced_call_step(std::string_view rest, size_t body, bool complete, Delta& out);
  // A call that streams, from its opening (the '{' or the <tool_call> tag at rest[0]): nullopt to wait for
  // more text, 0 when it is not one, else the bytes up to its arguments' brace (the call is then open).
  std::optional<size_t> open_call(std::string_view rest, bool hermes, bool complete, Delta& out);
  std::optional<size_t> open_call_step(std::string_view rest, bool complete, Delta& out);
  // The calls a JSON object (or, at the start, a list of objects) stands for; nullopt when it is not one.
  std::optional<std::vector<ToolCall>> calls_in(std::string_view json_text, bool list_allowed) const;

  ToolCallFormat format_;
  std::vector<std::string> names_;  // the tools that may be called
  bool parallel_;
  std::string text_;        // what was fed and is not settled yet (content or calls)
  bool leading_ = true;     // only calls (and whitespace) so far
  bool content_started_ = false;
  std::string held_space_;  // whitespace after the content so far: sent once more content follows
  size_t calls_ = 0;

  // The call streaming now.
  struct OpenCall {
    enum class Stage { kArguments, kCallObject, kClosingTag } stage = Stage::kArguments;
    size_t index = 0;
    bool hermes = false;  // closes with </tool_call>
    bool kept = true;     // false: a call past the first with parallel_tool_calls false (its text is dropped)
    JsonBrackets brackets;  // over the part scanned: the arguments, then the rest of the call object
  };
  std::optional<OpenCall> open_;
};

// What a grammar needs to constrain output to a call of one tool: the text
// before the arguments object, the arguments' JSON schema (the tool's
// parameters; an empty object schema when it has none) and the text after.
// Text written exactly as begin + arguments + end parses back as that call.
struct ToolCallShape {
  std::string begin;
  nlohmann::json schema;
  std::string end;
};

// One shape per tool (only the named tool for a named tool_choice).
std::vector<ToolCallShape> tool_call_shapes(const ToolRequest& tools, ToolCallFormat format);
// A call written in the format's shape (begin + arguments + end), e.g. to
// show a model its earlier calls.
std::string tool_call_text(const std::string& name, const std::string& arguments, ToolCallFormat format);
// The text that starts a call: where constrained decoding of a call begins.
std::vector<std::string> tool_call_triggers(ToolCallFormat format);

}  // namespace kvserve::server
