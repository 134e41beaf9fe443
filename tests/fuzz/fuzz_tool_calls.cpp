// libFuzzer target: tool calls in model output. The first byte picks the
// format and a piece size, the rest is the text; streamed in pieces it must
// give the content and calls of the whole parse (ids aside).
#include <cstdlib>
#include <string>
#include <vector>

#include "server/tool_calls.h"

using namespace kvserve::server;

namespace {

ToolRequest fuzz_tools() {
  const nlohmann::json tool = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const nlohmann::json other = {{"type", "function"}, {"function", {{"name", "f"}}}};
  return *parse_tool_request({{"tools", {tool, other}}});
}

bool same(const ParsedToolOutput& a, const ParsedToolOutput& b) {
  if (a.content != b.content || a.calls.size() != b.calls.size()) return false;
  for (size_t i = 0; i < a.calls.size(); ++i)
    if (a.calls[i].name != b.calls[i].name || a.calls[i].arguments != b.calls[i].arguments) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ToolRequest tools = fuzz_tools();
  if (size == 0) return 0;
  const auto format = static_cast<ToolCallFormat>(data[0] % 3);
  const size_t piece = data[0] / 3 % 16 + 1;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const ParsedToolOutput whole = parse_tool_calls(text, format, tools);
  ToolCallStream stream(format, tools);
  ParsedToolOutput streamed;
  auto take = [&](ToolCallStream::Delta d) {
    streamed.content += d.content;
    add_call_pieces(streamed.calls, d.calls);
  };
  for (size_t at = 0; at < text.size(); at += piece) take(stream.feed(text.substr(at, piece)));
  take(stream.finish());
  if (!same(whole, streamed)) std::abort();
  return 0;
}
