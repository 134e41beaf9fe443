#pragma once
// Reasoning models (Qwen3, DeepSeek-R1, QwQ) write their thinking between
// <think> and </think> before the answer. The server returns it apart, as
// message.reasoning_content (delta.reasoning_content when streaming), the
// way vLLM's and llama-server's reasoning parsers do.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvserve::server {

struct ReasoningSyntax {
  std::string start = "<think>";
  std::string end = "</think>";
};

// The syntax a chat template's model reasons in: <think> tags when the
// template writes or strips them, else nullopt (no reasoning is parsed).
std::optional<ReasoningSyntax> reasoning_syntax_for(const std::string& chat_template_source);

// Whether a rendered prompt ends inside an open reasoning block: templates
// such as DeepSeek-R1's (and Qwen3's thinking variants) write the start tag
// themselves, so the output begins with reasoning and only the end tag comes.
bool prompt_opens_reasoning(std::string_view prompt, const ReasoningSyntax& syntax);

// Splits a stream of output text into reasoning and content, exactly at the
// tags even when a tag arrives across several pieces (the bytes that may begin
// one are held back until they settle). A start tag counts only at the start
// of the output (after whitespace); the tags themselves, the whitespace right
// after each and the whitespace before the answer are in neither part.
// Without an end tag (the output was cut short) everything after the start
// tag is reasoning.
class ReasoningSplitter {
 public:
  ReasoningSplitter(ReasoningSyntax syntax, bool starts_in_reasoning);

  struct Parts {
    std::string reasoning;
    std::string content;
  };
  Parts feed(std::string_view text);
  Parts finish();  // the output is complete: settles what was held back
  // Still before the end tag (or before knowing whether the output reasons).
  bool in_reasoning() const { return state_ != State::kContent; }
  // Inside the reasoning block: past its start, before its end.
  bool inside_block() const { return state_ == State::kReasoning; }

 private:
  enum class State { kBeforeStart, kReasoning, kContent };
  void settle(Parts& out);

  ReasoningSyntax syntax_;
  State state_;
  std::string held_;          // fed and not settled: may begin a tag
  bool skip_space_ = true;    // drop whitespace until the part's first other byte
};

// Counts an output's reasoning tokens (usage.completion_tokens_details):
// those from the one that starts the block to the one that ends it. Fed token
// by token, so that the count does not depend on how tokens were grouped
// into events (speculative decoding sends several at once).
class ReasoningTokenCounter {
 public:
  ReasoningTokenCounter(ReasoningSyntax syntax, bool starts_in_reasoning)
      : splitter_(std::move(syntax), starts_in_reasoning) {}
  void add(std::string_view token_text);
  int64_t count() const { return count_; }

 private:
  ReasoningSplitter splitter_;
  int64_t count_ = 0;
  int64_t undecided_ = 0;  // tokens before knowing whether the output reasons
};

}  // namespace kvserve::server
