#pragma once
// Holds back generated text that might be the start of a stop string, and
// cuts the text at the first complete stop string.
//
// The search is incremental: one Knuth-Morris-Pratt automaton per stop
// string, its state (the longest prefix of the stop that ends the text so
// far) carried from push to push, so each new byte is looked at once per
// stop and the text before it never again. A push of b bytes costs
// O(stops x (b + longest stop)) steps at worst and O(stops x b) amortized over
// a generation, whatever its length; the held-back text is at most the
// longest stop - 1 bytes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvserve {

// Caps on a request's stop strings (checked by Engine::submit and the server's
// request parser). OpenAI allows 4 strings; 16 leaves room for a template's
// several end markers plus the client's own. 256 bytes is far past any real
// delimiter ("<|im_end|>" is 10) and bounds a sequence's held-back text.
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;

// A request's stop strings compiled for matching; immutable, shared by the
// request's sequences.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);  // empty strings are dropped

 private:
  friend class StopStringMatcher;
  struct Pattern {
    std::string text;
    // fallback[i]: the longest proper prefix of text[0, i] that is also its suffix (KMP's failure function).
    std::vector<uint32_t> fallback;
  };
  std::vector<Pattern> patterns_;
};

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::shared_ptr<const StopStrings> stops);
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Adds newly decoded text; returns the text that is now safe to emit.
  // After a stop string is found, stopped() is true and the returned text
  // ends just before it (the earliest-starting stop in the held-back text
  // plus `text`); later calls return "".
  std::string push(const std::string& text);
  // The held-back text, released when generation ends for another reason.
  // Text pushed afterwards is matched on its own.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string found ("" before one is): Anthropic's stop_sequence, vLLM's stop_reason.
  std::string matched() const;
  // Automaton steps taken so far (a byte compared or a fallback): the work
  // done, which tests check is linear in the text pushed.
  int64_t steps() const { return steps_; }

 private:
  std::shared_ptr<const StopStrings> stops_;
  std::vector<uint32_t> matched_;  // per stop: the length of its longest prefix that ends the text so far
  std::string pending_;            // held back: the longest of those prefixes
  bool stopped_ = false;
  size_t matched_stop_ = 0;  // the pattern found, once stopped_
  int64_t steps_ = 0;
};

}  // namespace kvserve
