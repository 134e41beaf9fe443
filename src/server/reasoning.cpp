#include "server/reasoning.h"

namespace kvserve::server {
namespace {

bool is_whitespace_byte(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && is_whitespace_byte(s.back())) s.remove_suffix(1);
  return s;
}

// The length of the longest end of `text` that begins `tag` (and is shorter than it).
size_t partial_tag_at_end(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (tag.substr(0, n) == text.substr(text.size() - n)) return n;
  return 0;
}

}  // namespace

std::optional<ReasoningSyntax> reasoning_syntax_for(const std::string& chat_template_source) {
  const ReasoningSyntax syntax;
  if (chat_template_source.find(syntax.start) == std::string::npos &&
      chat_template_source.find(syntax.end) == std::string::npos)
    return std::nullopt;
  return syntax;
}

bool prompt_opens_reasoning(std::string_view prompt, const ReasoningSyntax& syntax) {
  return trim_right(prompt).ends_with(syntax.start);
}

ReasoningSplitter::ReasoningSplitter(ReasoningSyntax syntax, bool starts_in_reasoning)
    : syntax_(std::move(syntax)), state_(starts_in_reasoning ? State::kReasoning : State::kBeforeStart) {}

ReasoningSplitter::Parts ReasoningSplitter::feed(std::string_view text) {
  held_ += text;
  Parts out;
  settle(out);
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  Parts out;
  settle(out);
  if (state_ == State::kReasoning) out.reasoning += trim_right(held_);
  else out.content += held_;  // a start tag that never completed is the answer's text
  held_.clear();
  return out;
}

void ReasoningSplitter::settle(Parts& out) {
  for (;;) {
    if (skip_space_) {
      size_t n = 0;
      while (n < held_.size() && is_whitespace_byte(held_[n])) ++n;
      held_.erase(0, n);
      if (held_.empty()) return;
      skip_space_ = false;
    }
    if (state_ == State::kBeforeStart) {
      if (held_.starts_with(syntax_.start)) {
        held_.erase(0, syntax_.start.size());
        state_ = State::kReasoning;
        skip_space_ = true;
        continue;
      }
      if (syntax_.start.starts_with(held_)) return;  // may still become the tag
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kContent) {
      out.content += held_;
      held_.clear();
      return;
    }
    if (const size_t end = held_.find(syntax_.end); end != std::string::npos) {
      out.reasoning += trim_right(std::string_view(held_).substr(0, end));
      held_.erase(0, end + syntax_.end.size());
      state_ = State::kContent;
      skip_space_ = true;
      continue;
    }
    // Hold back what may begin the end tag, and whitespace that may end up before it.
    const std::string_view settled = trim_right(
        std::string_view(held_).substr(0, held_.size() - partial_tag_at_end(held_, syntax_.end)));
    out.reasoning += settled;
    held_.erase(0, settled.size());
    return;
  }
}

void ReasoningTokenCounter::add(std::string_view token_text) {
  if (!splitter_.in_reasoning()) return;  // the answer has begun: nothing more is reasoning
  const bool inside_before = splitter_.inside_block();
  const ReasoningSplitter::Parts parts = splitter_.feed(token_text);
  if (inside_before || splitter_.inside_block() || !parts.reasoning.empty()) {
    count_ += undecided_ + 1;  // the start tag's earlier tokens too
    undecided_ = 0;
  } else if (splitter_.in_reasoning()) {
    ++undecided_;  // whitespace or part of a start tag: reasoning if the block starts
  }
}

}  // namespace kvserve::server
