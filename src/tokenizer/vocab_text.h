#pragma once
// How the two vocabulary kinds spell bytes inside their pieces.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvserve {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
// the other 68 bytes for U+0100.. in byte order, so that every byte is a
// visible, non-space character. Returns that character as UTF-8.
const std::string& gpt2_byte_to_piece(uint8_t byte);
// The inverse over a whole piece; characters outside the mapping are kept as
// their UTF-8 bytes (user-added pieces are often stored as plain text).
std::string gpt2_piece_to_bytes(std::string_view piece);

// SentencePiece spells a space as U+2581 LOWER ONE EIGHTH BLOCK.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";
std::string spm_escape_spaces(std::string_view text);
std::string spm_unescape_spaces(std::string_view piece);
// Parses a byte-fallback piece "<0xNN>".
std::optional<uint8_t> parse_byte_piece(std::string_view piece);

}  // namespace kvserve
