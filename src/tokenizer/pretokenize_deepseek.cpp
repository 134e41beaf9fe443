// The DeepSeek pre-tokenizers as llama.cpp runs them (src/llama-vocab.cpp,
// LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM / DEEPSEEK3_LLM / DEEPSEEK_CODER; applied
// by src/unicode.cpp's unicode_regex_split). Each is a list of regexes
// applied as a chain of splits: a regex splits every piece the previous one
// left, its matches and the gaps between them all becoming pieces; a match
// never crosses a piece's end.
//
// Two details of llama.cpp's matcher that the classes below follow:
//  - every non-ASCII whitespace character is replaced by U+000B before
//    matching, so it is \s but never in an explicit range: U+3000 is not in
//    DeepSeek-LLM's [　-。] nor U+2003 in its [ࠀ-一] (in_table() below);
//  - `$` is the end of the piece (std::regex ECMAScript, no multiline).
#include "tokenizer/pretokenize_deepseek.h"

#include <cstdint>
#include <span>

#include "tokenizer/unicode.h"

namespace kvserve {

namespace {

// DeepSeek-LLM's letter class (its second regex), range by range as the
// regex lists them: Latin, IPA, Greek, Coptic, Cyrillic, Armenian capitals,
// Georgian capitals, Cherokee, phonetic extensions, Greek extended, letterlike
// symbols, Glagolitic, Latin extended-C/D, Cyrillic extended-B, Cherokee
// small letters, ligatures, fullwidth Latin, Deseret, Osage, Old Hungarian,
// Warang Citi, Adlam. Not \p{L}: no CJK, Arabic, Hebrew, lowercase Armenian...
constexpr CodepointRange kLlmLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},     {0x295, 0x2AF},     {0x370, 0x373},
    {0x376, 0x377},     {0x37B, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// DeepSeek-LLM's [!-/:-~！-／：-～‘-‟　-。]: ASCII punctuation and symbols (and,
// through :-~, the ASCII letters, split off before), curly quotes, U+3000-3002,
// fullwidth punctuation (and fullwidth letters, also split off before).
constexpr CodepointRange kLlmPunctuation[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

// [一-龥ࠀ-一가-퟿] of DeepSeek-LLM and DeepSeek-Coder: U+0800-4E00 and
// U+4E00-9FA5 (one range here, the two touch), U+AC00-D7FF. The first is much
// wider than CJK: Indic scripts, Thai, Georgian, kana, CJK punctuation...
constexpr CodepointRange kLlmCjk[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

// DeepSeek-V3's [一-龥぀-ゟ゠-ヿ]: hiragana, katakana, CJK U+4E00-9FA5.
constexpr CodepointRange kV3CjkKana[] = {{0x3040, 0x309F}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5}};

// An explicit range of a regex; llama.cpp has turned whitespace into U+000B first.
bool in_table(std::span<const CodepointRange> table, uint32_t cp) { return !is_whitespace(cp) && in_ranges(table, cp); }

bool is_line_break_char(uint32_t cp) { return cp == '\r' || cp == '\n'; }
bool is_ascii_letter(uint32_t cp) { return cp < 0x80 && is_letter(cp); }
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
bool is_ascii_punctuation(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}
bool is_punctuation_or_symbol(uint32_t cp) { return is_punctuation(cp) || is_symbol(cp); }
bool is_letter_or_mark(uint32_t cp) { return is_letter(cp) || is_mark(cp); }

// The pieces of a text as the chain of regexes goes along: [begin, end)
// ranges of characters that tile the text.
class SplitChain {
 public:
  explicit SplitChain(const std::vector<Utf8Char>& chars) : chars_(chars) {
    if (!chars.empty()) pieces_.push_back({0, chars.size()});
  }

  uint32_t cp(size_t i) const { return chars_[i].codepoint; }

  // One regex: match(i, end) is the end of its match at character i of a
  // piece that ends at `end` (> i), or i itself for none. Searches each piece
  // left to right like std::regex_iterator; every failed try costs O(1) for
  // the matchers below, and a match resumes the search at its end.
  template <class Match>
  void split(Match match) {
    std::vector<Piece> out;
    out.reserve(pieces_.size());
    for (const Piece& piece : pieces_) {
      size_t gap = piece.begin;
      for (size_t i = piece.begin; i < piece.end;) {
        const size_t j = match(i, piece.end);
        if (j == i) {
          ++i;
          continue;
        }
        if (gap < i) out.push_back({gap, i});
        out.push_back({i, j});
        i = gap = j;
      }
      if (gap < piece.end) out.push_back({gap, piece.end});
    }
    pieces_ = std::move(out);
  }

  // `\s+$`: the whitespace at the end of each piece (found from the end, not
  // by trying each start, which would be quadratic on a long run).
  void split_trailing_whitespace() {
    std::vector<Piece> out;
    out.reserve(pieces_.size());
    for (const Piece& piece : pieces_) {
      size_t tail = piece.end;
      while (tail > piece.begin && is_whitespace(cp(tail - 1))) --tail;
      if (tail > piece.begin && tail < piece.end) {
        out.push_back({piece.begin, tail});
        out.push_back({tail, piece.end});
      } else {
        out.push_back(piece);
      }
    }
    pieces_ = std::move(out);
  }

  // The end of the run of characters in `cls` from i, i for none.
  template <class Class>
  size_t run(size_t i, size_t end, Class cls, size_t max_length = SIZE_MAX) const {
    size_t j = i;
    while (j < end && j - i < max_length && cls(cp(j))) ++j;
    return j;
  }

  // `\s?X+`
  template <class Class>
  size_t space_then_run(size_t i, size_t end, Class cls) const {
    if (is_whitespace(cp(i)) && i + 1 < end && cls(cp(i + 1))) return run(i + 1, end, cls);
    return run(i, end, cls);
  }

  std::vector<ByteSpan> spans() const {
    std::vector<ByteSpan> spans;
    spans.reserve(pieces_.size());
    for (const Piece& p : pieces_) {
      spans.emplace_back(chars_[p.begin].offset, chars_[p.end - 1].offset + chars_[p.end - 1].length);
    }
    return spans;
  }

 private:
  struct Piece {
    size_t begin;
    size_t end;
  };
  const std::vector<Utf8Char>& chars_;
  std::vector<Piece> pieces_;
};

bool llm_letter(uint32_t cp) { return in_table(kLlmLetters, cp); }
bool llm_punctuation(uint32_t cp) { return in_table(kLlmPunctuation, cp); }
bool llm_cjk(uint32_t cp) { return in_table(kLlmCjk, cp); }
bool v3_cjk_kana(uint32_t cp) { return in_table(kV3CjkKana, cp); }

// [\r\n]
size_t line_break(const SplitChain& c, size_t i) { return is_line_break_char(c.cp(i)) ? i + 1 : i; }

// "[\r\n]", "\s?[letters]+", "\s?[punctuation]+", "\s+$", "[CJK]+", "\p{N}+"
void split_deepseek_llm(SplitChain& c) {
  c.split([&](size_t i, size_t) { return line_break(c, i); });
  c.split([&](size_t i, size_t end) { return c.space_then_run(i, end, llm_letter); });
  c.split([&](size_t i, size_t end) { return c.space_then_run(i, end, llm_punctuation); });
  c.split_trailing_whitespace();
  c.split([&](size_t i, size_t end) { return c.run(i, end, llm_cjk); });
  c.split([&](size_t i, size_t end) { return c.run(i, end, is_number); });
}

// "[\r\n]", "\s?\p{L}+", "\s?\p{P}+", "[CJK]+", "\p{N}"
void split_deepseek_coder(SplitChain& c) {
  c.split([&](size_t i, size_t) { return line_break(c, i); });
  c.split([&](size_t i, size_t end) { return c.space_then_run(i, end, is_letter); });
  c.split([&](size_t i, size_t end) { return c.space_then_run(i, end, is_punctuation); });
  c.split([&](size_t i, size_t end) { return c.run(i, end, llm_cjk); });
  c.split([&](size_t i, size_t end) { return c.run(i, end, is_number, 1); });
}

// DeepSeek-V3's last regex, one alternative after the other:
//   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
//   | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//   | ?[\p{P}\p{S}]+[\r\n]*
//   | \s*[\r\n]+
//   | \s+(?!\S)
//   | \s+
size_t match_deepseek_v3_words(const SplitChain& c, size_t i, size_t end) {
  const auto at = [&](size_t k, auto cls) { return k < end && cls(c.cp(k)); };
  if (at(i, is_ascii_punctuation) && at(i + 1, is_ascii_letter)) return c.run(i + 1, end, is_ascii_letter);

  const auto prefix = [](uint32_t cp) {
    return !is_line_break_char(cp) && !is_letter(cp) && !is_punctuation(cp) && !is_symbol(cp);
  };
  if (at(i, prefix) && at(i + 1, is_letter_or_mark)) return c.run(i + 1, end, is_letter_or_mark);
  if (at(i, is_letter_or_mark)) return c.run(i, end, is_letter_or_mark);

  const bool space_first = c.cp(i) == ' ' && at(i + 1, is_punctuation_or_symbol);
  const size_t symbols = space_first ? i + 1 : i;
  if (at(symbols, is_punctuation_or_symbol)) {
    return c.run(c.run(symbols, end, is_punctuation_or_symbol), end, is_line_break_char);
  }

  const size_t spaces_end = c.run(i, end, is_whitespace);
  if (spaces_end == i) return i;
  // \s*[\r\n]+: the greedy \s* backs off to the run's last line break.
  for (size_t k = spaces_end; k > i; --k) {
    if (is_line_break_char(c.cp(k - 1))) return k;
  }
  // \s+(?!\S): the run, less its last character when text follows; else \s+.
  if (spaces_end == end || spaces_end - i == 1) return spaces_end;
  return spaces_end - 1;
}

// "\p{N}{1,3}", "[CJK and kana]+", then the words regex above
void split_deepseek_v3(SplitChain& c) {
  c.split([&](size_t i, size_t end) { return c.run(i, end, is_number, 3); });
  c.split([&](size_t i, size_t end) { return c.run(i, end, v3_cjk_kana); });
  c.split([&](size_t i, size_t end) { return match_deepseek_v3_words(c, i, end); });
}

}  // namespace

std::vector<ByteSpan> pre_tokenize_deepseek(const std::vector<Utf8Char>& chars, PreTokenizer kind) {
  SplitChain chain(chars);
  switch (kind) {
    case PreTokenizer::kDeepSeekLlm:
      split_deepseek_llm(chain);
      break;
    case PreTokenizer::kDeepSeekCoder:
      split_deepseek_coder(chain);
      break;
    case PreTokenizer::kDeepSeekV3:
      split_deepseek_v3(chain);
      break;
    default:
      break;
  }
  return chain.spans();
}

}  // namespace kvserve
