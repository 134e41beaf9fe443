#include "server/chat_output.h"

namespace kvserve::server {

ChatOutputStream::ChatOutputStream(const ChatOutputSyntax& syntax) {
  if (syntax.reasoning) reasoning_.emplace(*syntax.reasoning, syntax.starts_in_reasoning);
  if (syntax.tools && syntax.tools->calls_allowed()) tools_.emplace(syntax.tool_format, *syntax.tools);
}

ChatDelta ChatOutputStream::feed(std::string_view text) {
  if (!reasoning_) return take_apart({"", std::string(text)}, false);
  return take_apart(reasoning_->feed(text), false);
}

void ChatDelta::append(ChatDelta more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ToolCallDelta& piece : more.calls) {
    if (!piece.first && !calls.empty() && calls.back().index == piece.index) {
      calls.back().arguments += piece.arguments;
      calls.back().last = piece.last;
    } else {
      calls.push_back(std::move(piece));
    }
  }
}

std::vector<ToolCall> ChatDelta::whole_calls() const {
  std::vector<ToolCall> out;
  add_call_pieces(out, calls);
  return out;
}

ChatDelta ChatOutputStream::feed(std::string_view text, bool last) {
  ChatDelta delta = feed(text);
  if (last) delta.append(finish());
  return delta;
}

ChatDelta ChatOutputStream::finish() {
  return take_apart(reasoning_ ? reasoning_->finish() : ReasoningSplitter::Parts{}, true);
}

// Tool calls are looked for in the answer only: a reasoning model drafts calls while it thinks.
ChatDelta ChatOutputStream::take_apart(ReasoningSplitter::Parts parts, bool complete) {
  ChatDelta out;
  out.reasoning = std::move(parts.reasoning);
  if (!tools_) {
    out.content = std::move(parts.content);
    return out;
  }
  ToolCallStream::Delta delta = tools_->feed(parts.content);
  out.append({"", std::move(delta.content), std::move(delta.calls)});
  if (complete) {
    ToolCallStream::Delta last = tools_->finish();
    out.append({"", std::move(last.content), std::move(last.calls)});
  }
  return out;
}

}  // namespace kvserve::server
