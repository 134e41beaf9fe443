#include "tokenizer/vocab_text.h"

#include <array>

#include "tokenizer/unicode.h"

namespace kvserve {

namespace {

bool gpt2_byte_is_printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

struct Gpt2ByteMap {
  std::array<std::string, 256> byte_to_piece;
  std::array<int16_t, 512> codepoint_to_byte;  // -1 where no byte maps

  Gpt2ByteMap() {
    codepoint_to_byte.fill(-1);
    uint32_t next_unprintable = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = gpt2_byte_is_printable(b) ? static_cast<uint32_t>(b) : next_unprintable++;
      append_utf8(byte_to_piece[b], cp);
      codepoint_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Gpt2ByteMap& gpt2_byte_map() {
  static const Gpt2ByteMap map;
  return map;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(text.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace

const std::string& gpt2_byte_to_piece(uint8_t byte) { return gpt2_byte_map().byte_to_piece[byte]; }

std::string gpt2_piece_to_bytes(std::string_view piece) {
  const Gpt2ByteMap& map = gpt2_byte_map();
  std::string bytes;
  for (const Utf8Char& c : decode_utf8(piece)) {
    const int byte = c.codepoint < map.codepoint_to_byte.size() ? map.codepoint_to_byte[c.codepoint] : -1;
    if (byte >= 0) {
      bytes += static_cast<char>(byte);
    } else {
      bytes.append(piece.substr(c.offset, c.length));
    }
  }
  return bytes;
}

std::string spm_escape_spaces(std::string_view text) { return replace_all(text, " ", kSpmSpace); }

std::string spm_unescape_spaces(std::string_view piece) { return replace_all(piece, kSpmSpace, " "); }

std::optional<uint8_t> parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece.back() != '>') return std::nullopt;
  const int hi = hex_digit(piece[3]);
  const int lo = hex_digit(piece[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

}  // namespace kvserve
