#include "tokenizer/pretokenize.h"

#include <array>

#include "tokenizer/pretokenize_deepseek.h"
#include "tokenizer/unicode.h"

namespace kvserve {

namespace {

struct PreTokenizerName {
  std::string_view name;
  PreTokenizer kind;
};

// Values of tokenizer.ggml.pre as written by llama.cpp's converter, grouped
// by the pattern they use.
constexpr std::array kPreTokenizerNames{
    PreTokenizerName{"default", PreTokenizer::kGpt2},
    PreTokenizerName{"gpt2", PreTokenizer::kGpt2},
    PreTokenizerName{"gpt-2", PreTokenizer::kGpt2},
    PreTokenizerName{"smollm", PreTokenizer::kGpt2SplitDigits},
    PreTokenizerName{"starcoder", PreTokenizer::kGpt2SplitDigits},
    PreTokenizerName{"refact", PreTokenizer::kGpt2SplitDigits},
    PreTokenizerName{"llama-bpe", PreTokenizer::kLlama3},
    PreTokenizerName{"llama3", PreTokenizer::kLlama3},
    PreTokenizerName{"smaug-bpe", PreTokenizer::kLlama3},
    PreTokenizerName{"dbrx", PreTokenizer::kLlama3},
    PreTokenizerName{"qwen2", PreTokenizer::kQwen2},
    PreTokenizerName{"deepseek-r1-qwen", PreTokenizer::kQwen2},
    PreTokenizerName{"deepseek-llm", PreTokenizer::kDeepSeekLlm},
    PreTokenizerName{"deepseek-v3", PreTokenizer::kDeepSeekV3},
    PreTokenizerName{"deepseek-coder", PreTokenizer::kDeepSeekCoder},
};

bool is_cr_or_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

uint32_t ascii_lower(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; }

// Matches one pattern alternative at a time on chars [begin, end). Each rule
// returns the end of its match, or `i` itself when it does not match.
class PatternMatcher {
 public:
  PatternMatcher(const std::vector<Utf8Char>& chars, size_t end, PreTokenizer kind)
      : chars_(chars), end_(end), llama3_style_(kind == PreTokenizer::kLlama3 || kind == PreTokenizer::kQwen2),
        max_digits_(kind == PreTokenizer::kLlama3 ? 3 : kind == PreTokenizer::kQwen2 ? 1 : SIZE_MAX) {}

  // The end of the match starting at i (always > i).
  size_t match(size_t i) const {
    size_t j = contraction(i);
    if (j == i) j = llama3_style_ ? letters_llama3(i) : letters_gpt2(i);
    if (j == i) j = numbers(i);
    if (j == i) j = punctuation(i);
    if (j == i && llama3_style_) j = spaces_then_newlines(i);
    if (j == i) j = spaces_not_before_text(i);
    if (j == i) j = space_run_end(i);
    return j == i ? i + 1 : j;
  }

 private:
  bool has(size_t i) const { return i < end_; }
  uint32_t cp(size_t i) const { return chars_[i].codepoint; }
  bool letter(size_t i) const { return has(i) && is_letter(cp(i)); }
  bool number(size_t i) const { return has(i) && is_number(cp(i)); }
  bool space(size_t i) const { return has(i) && is_whitespace(cp(i)); }
  bool other(size_t i) const { return has(i) && !is_whitespace(cp(i)) && !is_letter(cp(i)) && !is_number(cp(i)); }
  bool is(size_t i, uint32_t c) const { return has(i) && cp(i) == c; }

  // 's|'t|'re|'ve|'m|'ll|'d (ASCII case-insensitive in the Llama 3 family)
  size_t contraction(size_t i) const {
    if (!is(i, '\'') || !has(i + 1)) return i;
    const auto lower = [&](size_t k) { return llama3_style_ ? ascii_lower(cp(k)) : cp(k); };
    const uint32_t a = lower(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (!has(i + 2)) return i;
    const uint32_t b = lower(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return i;
  }
  size_t letter_run(size_t i, size_t j) const {
    if (!letter(j)) return i;
    while (letter(j)) ++j;
    return j;
  }
  // ` ?\p{L}+`
  size_t letters_gpt2(size_t i) const { return letter_run(i, is(i, ' ') && letter(i + 1) ? i + 1 : i); }
  // `[^\r\n\p{L}\p{N}]?\p{L}+`
  size_t letters_llama3(size_t i) const {
    const bool prefix = has(i) && !is_cr_or_lf(cp(i)) && !letter(i) && !number(i) && letter(i + 1);
    return letter_run(i, prefix ? i + 1 : i);
  }
  // ` ?\p{N}+` (GPT-2), `\p{N}{1,3}` (Llama 3), `\p{N}` (Qwen2)
  size_t numbers(size_t i) const {
    size_t j = i;
    if (!llama3_style_ && is(j, ' ') && number(j + 1)) ++j;
    const size_t first = j;
    while (number(j) && j - first < max_digits_) ++j;
    return j == first ? i : j;
  }
  // ` ?[^\s\p{L}\p{N}]+`, followed by `[\r\n]*` in the Llama 3 family
  size_t punctuation(size_t i) const {
    size_t j = is(i, ' ') && other(i + 1) ? i + 1 : i;
    if (!other(j)) return i;
    while (other(j)) ++j;
    if (llama3_style_) {
      while (has(j) && is_cr_or_lf(cp(j))) ++j;
    }
    return j;
  }
  size_t space_run_end(size_t i) const {
    size_t j = i;
    while (space(j)) ++j;
    return j;
  }
  // `\s*[\r\n]+`: the greedy \s* backs off to the run's last line break.
  size_t spaces_then_newlines(size_t i) const {
    const size_t run_end = space_run_end(i);
    for (size_t k = run_end; k > i; --k) {
      if (is_cr_or_lf(cp(k - 1))) return k;
    }
    return i;
  }
  // `\s+(?!\S)`: a whitespace run, less its last character when text follows,
  // so that character can lead the next word.
  size_t spaces_not_before_text(size_t i) const {
    const size_t run_end = space_run_end(i);
    if (run_end == i || !has(run_end)) return run_end;
    return run_end - i >= 2 ? run_end - 1 : i;
  }

  const std::vector<Utf8Char>& chars_;
  size_t end_;
  bool llama3_style_;
  size_t max_digits_;
};

void split_segment(const std::vector<Utf8Char>& chars, size_t begin, size_t end, PreTokenizer kind,
                   std::vector<ByteSpan>& out) {
  const PatternMatcher matcher(chars, end, kind);
  for (size_t i = begin; i < end;) {
    const size_t j = matcher.match(i);
    out.emplace_back(chars[i].offset, chars[j - 1].offset + chars[j - 1].length);
    i = j;
  }
}

}  // namespace

std::optional<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
  for (const auto& entry : kPreTokenizerNames) {
    if (entry.name == name) return entry.kind;
  }
  return std::nullopt;
}

std::string known_pre_tokenizer_names() {
  std::string names;
  for (const auto& entry : kPreTokenizerNames) {
    if (!names.empty()) names += ", ";
    names += entry.name;
  }
  return names;
}

std::vector<ByteSpan> pre_tokenize(std::string_view text, PreTokenizer kind) {
  const std::vector<Utf8Char> chars = decode_utf8(text);
  if (kind == PreTokenizer::kDeepSeekLlm || kind == PreTokenizer::kDeepSeekV3 ||
      kind == PreTokenizer::kDeepSeekCoder) {
    return pre_tokenize_deepseek(chars, kind);
  }
  std::vector<ByteSpan> spans;
  if (kind != PreTokenizer::kGpt2SplitDigits) {
    split_segment(chars, 0, chars.size(), kind, spans);
    return spans;
  }
  // Digits first become pieces of their own; the text between them is then
  // split with the GPT-2 pattern as if each stretch were a whole text.
  size_t segment_begin = 0;
  for (size_t i = 0; i <= chars.size(); ++i) {
    if (i < chars.size() && !is_number(chars[i].codepoint)) continue;
    split_segment(chars, segment_begin, i, PreTokenizer::kGpt2, spans);
    if (i < chars.size()) spans.emplace_back(chars[i].offset, chars[i].offset + chars[i].length);
    segment_begin = i + 1;
  }
  return spans;
}

}  // namespace kvserve
