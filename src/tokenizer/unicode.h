#pragma once
// The small slice of Unicode the tokenizer needs: lenient UTF-8 decoding
// (invalid bytes survive as themselves so that byte-level encoding stays
// lossless), and the letter / number / whitespace classes of the
// pre-tokenizer's patterns. The letter, number, punctuation, symbol and mark
// classes are the full general-category tables of Unicode 14 (generated, see
// unicode_tables.cpp);
// a regex engine on a newer Unicode version may classify a few recently
// added characters differently.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve {

struct CodepointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

namespace unicode_tables {
extern const std::span<const CodepointRange> kLetters;  // general category L*
extern const std::span<const CodepointRange> kNumbers;  // general category N*
extern const std::span<const CodepointRange> kPunctuation;  // general category P*
extern const std::span<const CodepointRange> kSymbols;      // general category S*
extern const std::span<const CodepointRange> kMarks;        // general category M*
}  // namespace unicode_tables

// Whether cp lies in one of ranges, sorted by first and not overlapping.
bool in_ranges(std::span<const CodepointRange> ranges, uint32_t cp);

constexpr uint32_t kReplacementChar = 0xFFFD;

// One decoded character and where its bytes lie in the source text.
struct Utf8Char {
  uint32_t codepoint;  // kReplacementChar for a byte that starts no valid sequence
  uint32_t offset;
  uint32_t length;  // 1..4 bytes
};

// The sequence length a lead byte announces; 0 for a byte that cannot lead.
size_t utf8_lead_length(uint8_t lead);
// How many bytes from text[pos] on agree with some well-formed (shortest
// form, non-surrogate, <= U+10FFFF) sequence: 0 when the byte cannot lead,
// utf8_lead_length() for a complete character, in between for a character
// cut short or broken off (a "maximal subpart", replaced by one U+FFFD).
size_t utf8_valid_prefix_length(std::string_view text, size_t pos);
// Length of the complete, well-formed character at text[pos], or 0.
size_t utf8_sequence_length(std::string_view text, size_t pos);

// Splits text into characters; an invalid byte becomes a one-byte
// kReplacementChar entry, so the offsets always tile the whole text.
std::vector<Utf8Char> decode_utf8(std::string_view text);
void append_utf8(std::string& out, uint32_t codepoint);

bool is_letter(uint32_t cp);      // \p{L}
bool is_number(uint32_t cp);      // \p{N}
bool is_punctuation(uint32_t cp); // \p{P}
bool is_symbol(uint32_t cp);      // \p{S}
bool is_mark(uint32_t cp);        // \p{M}
bool is_whitespace(uint32_t cp);  // \s: the Unicode White_Space property

}  // namespace kvserve
