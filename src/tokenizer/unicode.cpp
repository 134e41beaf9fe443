#include "tokenizer/unicode.h"

#include <algorithm>

namespace kvserve {

namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The lead byte's sequence length and the allowed range of the second byte
// (which is what rules out overlong forms, surrogates and values > U+10FFFF).
struct LeadInfo {
  size_t length;
  uint8_t second_min;
  uint8_t second_max;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

bool in_ranges(std::span<const CodepointRange> ranges, uint32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](uint32_t v, const CodepointRange& r) { return v < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->last;
}

size_t utf8_lead_length(uint8_t lead) { return lead_info(lead).length; }

size_t utf8_valid_prefix_length(std::string_view text, size_t pos) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(text[pos]));
  if (info.length == 0) return 0;
  size_t n = 1;
  while (n < info.length && pos + n < text.size()) {
    const auto b = static_cast<uint8_t>(text[pos + n]);
    const bool fits = n == 1 ? (b >= info.second_min && b <= info.second_max) : is_continuation(b);
    if (!fits) break;
    ++n;
  }
  return n;
}

size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const size_t n = utf8_valid_prefix_length(text, pos);
  return n != 0 && n == utf8_lead_length(static_cast<uint8_t>(text[pos])) ? n : 0;
}

std::vector<Utf8Char> decode_utf8(std::string_view text) {
  std::vector<Utf8Char> chars;
  chars.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = utf8_sequence_length(text, pos);
    if (len == 0) {
      chars.push_back({kReplacementChar, static_cast<uint32_t>(pos), 1});
      ++pos;
      continue;
    }
    uint32_t cp = static_cast<uint8_t>(text[pos]);
    if (len > 1) {
      cp &= 0x7Fu >> len;
      for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
    }
    chars.push_back({cp, static_cast<uint32_t>(pos), static_cast<uint32_t>(len)});
    pos += len;
  }
  return chars;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(unicode_tables::kLetters, cp);
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(unicode_tables::kNumbers, cp);
}

bool is_punctuation(uint32_t cp) { return in_ranges(unicode_tables::kPunctuation, cp); }

bool is_symbol(uint32_t cp) { return in_ranges(unicode_tables::kSymbols, cp); }

bool is_mark(uint32_t cp) { return cp >= 0x300 && in_ranges(unicode_tables::kMarks, cp); }

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace kvserve
