#include "grammar/repetition_scan.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

namespace kvserve {
namespace {

constexpr int64_t kHuge = int64_t{1} << 60;  // counts saturate here (no overflow on multiplying two)

int64_t saturating_product(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kHuge / b ? kHuge : std::min(kHuge, a * b);
}

// Digits at `pos` as a number (saturated), advancing pos; nullopt when there are none.
std::optional<int64_t> read_count(std::string_view text, size_t& pos) {
  const size_t start = pos;
  int64_t value = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    value = value > kHuge / 10 ? kHuge : std::min(kHuge, value * 10 + (text[pos] - '0'));
    ++pos;
  }
  if (pos == start) return std::nullopt;
  return value;
}

struct Quantifier {
  int64_t count = 0;  // the largest number in it: what the automaton's size follows
  size_t end = 0;     // offset just past it
};

// {n}, {n,}, {n,m} or {,m} at `pos` (a '{'); nullopt for a literal brace.
std::optional<Quantifier> braces_at(std::string_view text, size_t pos) {
  size_t at = pos + 1;
  std::optional<int64_t> low = read_count(text, at);
  std::optional<int64_t> high = low;
  if (at < text.size() && text[at] == ',') {
    ++at;
    high = read_count(text, at);
  }
  if ((!low && !high) || at >= text.size() || text[at] != '}') return std::nullopt;
  return Quantifier{std::max(low.value_or(0), high.value_or(0)), at + 1};
}

// Lark's "~ n" or "~ n..m" at `pos` (a '~').
std::optional<Quantifier> tilde_at(std::string_view text, size_t pos) {
  size_t at = pos + 1;
  while (at < text.size() && text[at] == ' ') ++at;
  std::optional<int64_t> low = read_count(text, at);
  if (!low) return std::nullopt;
  int64_t high = *low;
  if (text.substr(at, 2) == "..") {
    at += 2;
    high = read_count(text, at).value_or(*low);
  }
  return Quantifier{std::max(*low, high), at};
}

// Offset just past a quoted literal or a character class that opens at `pos`.
size_t skip_delimited(std::string_view text, size_t pos, char close) {
  size_t at = pos + 1;
  while (at < text.size() && text[at] != close) at += text[at] == '\\' ? 2 : 1;
  return std::min(text.size(), at + 1);
}

// Offset just past an escape at `pos` (a backslash), with its braces: \u{1F600}, \p{L}, \x{41}.
size_t skip_escape(std::string_view text, size_t pos) {
  size_t at = pos + 2;
  if (pos + 1 < text.size() && std::strchr("upPx", text[pos + 1]) && at < text.size() && text[at] == '{')
    if (const size_t close = text.find('}', at); close != std::string_view::npos) return close + 1;
  return std::min(text.size(), at);
}

class Scanner {
 public:
  Scanner(std::string_view text, PatternSyntax syntax, const ConstraintLimits& limits, int64_t& repeated)
      : text_(text), syntax_(syntax), limits_(limits), repeated_(repeated) {}

  std::optional<std::string> run() {
    groups_.push_back(0);
    size_t pos = 0;
    while (pos < text_.size() && !problem_) pos = step(pos);
    return problem_;
  }

 private:
  // Handles what starts at `pos`; returns where the next thing starts.
  size_t step(size_t pos) {
    const char c = text_[pos];
    const bool ebnf = syntax_ == PatternSyntax::kEbnf;
    if (c == '\\') return atom(skip_escape(text_, pos));
    if (c == '[') return atom(skip_delimited(text_, pos, ']'));
    if (ebnf && (c == '"' || c == '\'')) return atom(skip_delimited(text_, pos, c));
    if (ebnf && c == '#') return std::min(text_.size(), text_.find('\n', pos));
    if (c == '(') return open(pos);
    if (c == ')') return close(pos);
    if (c == '{')
      if (std::optional<Quantifier> q = braces_at(text_, pos)) return quantify(pos, *q);
    if (ebnf && c == '~')
      if (std::optional<Quantifier> q = tilde_at(text_, pos)) return quantify(pos, *q);
    return atom(pos + 1);
  }

  size_t atom(size_t end) {
    last_ = 1;
    groups_.back() = std::min(kHuge, groups_.back() + 1);
    return end;
  }

  size_t open(size_t pos) {
    groups_.push_back(0);
    if (static_cast<int64_t>(groups_.size()) - 1 > limits_.max_nesting)
      problem_ = "groups nest deeper than " + std::to_string(limits_.max_nesting) + " levels at offset " +
                 std::to_string(pos);
    last_ = 0;
    return pos + 1;
  }

  size_t close(size_t pos) {
    if (groups_.size() == 1) return atom(pos + 1);  // unbalanced: xgrammar's parser reports it
    last_ = groups_.back();
    groups_.pop_back();
    groups_.back() = std::min(kHuge, groups_.back() + last_);
    return pos + 1;
  }

  // The last atom or group repeated q.count times: its positions unrolled.
  size_t quantify(size_t pos, const Quantifier& q) {
    const std::string where = std::string(text_.substr(pos, q.end - pos)) + " at offset " + std::to_string(pos);
    if (q.count > limits_.max_repetition) {
      problem_ = where + " repeats " + std::to_string(q.count) + " times, at most " +
                 std::to_string(limits_.max_repetition);
      return q.end;
    }
    const int64_t unrolled = saturating_product(last_, q.count);
    repeated_ = std::min(kHuge, repeated_ + unrolled);
    groups_.back() = std::min(kHuge, groups_.back() - last_ + unrolled);
    last_ = unrolled;
    if (repeated_ > limits_.max_repeated_positions)
      problem_ = where + " brings the positions of counted repetitions to " + std::to_string(repeated_) +
                 ", at most " + std::to_string(limits_.max_repeated_positions);
    return q.end;
  }

  std::string_view text_;
  PatternSyntax syntax_;
  const ConstraintLimits& limits_;
  int64_t& repeated_;            // positions counted repetitions unroll to, so far (of the whole spec)
  std::vector<int64_t> groups_;  // per open group: its positions unrolled so far
  int64_t last_ = 0;             // the positions of the last atom or group
  std::optional<std::string> problem_;
};

}  // namespace

std::optional<std::string> repetition_over_limits(std::string_view text, PatternSyntax syntax,
                                                  const ConstraintLimits& limits, int64_t& repeated) {
  return Scanner(text, syntax, limits, repeated).run();
}

}  // namespace kvserve
