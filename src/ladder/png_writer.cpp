#include "ladder/png_writer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>

#include "core/error.h"

namespace kvserve {
namespace {

// 5x7 glyphs, one byte per row, bit 4 = leftmost column. Upper case only:
// lower-case text is drawn in capitals.
struct Glyph {
  char c;
  std::array<uint8_t, 7> rows;
};

constexpr Glyph kFont[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},     {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {30, 1, 1, 14, 1, 1, 30}},     {'4', {2, 6, 10, 18, 31, 2, 2}},    {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},      {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},   {'A', {14, 17, 17, 31, 17, 17, 17}}, {'B', {30, 17, 17, 30, 17, 17, 30}},
    {'C', {14, 17, 16, 16, 16, 17, 14}}, {'D', {30, 17, 17, 17, 17, 17, 30}}, {'E', {31, 16, 16, 30, 16, 16, 31}},
    {'F', {31, 16, 16, 30, 16, 16, 16}}, {'G', {14, 17, 16, 23, 17, 17, 15}}, {'H', {17, 17, 17, 31, 17, 17, 17}},
    {'I', {14, 4, 4, 4, 4, 4, 14}},      {'J', {7, 2, 2, 2, 2, 18, 12}},     {'K', {17, 18, 20, 24, 20, 18, 17}},
    {'L', {16, 16, 16, 16, 16, 16, 31}}, {'M', {17, 27, 21, 21, 17, 17, 17}}, {'N', {17, 17, 25, 21, 19, 17, 17}},
    {'O', {14, 17, 17, 17, 17, 17, 14}}, {'P', {30, 17, 17, 30, 16, 16, 16}}, {'Q', {14, 17, 17, 17, 21, 18, 13}},
    {'R', {30, 17, 17, 30, 20, 18, 17}}, {'S', {15, 16, 16, 14, 1, 1, 30}},  {'T', {31, 4, 4, 4, 4, 4, 4}},
    {'U', {17, 17, 17, 17, 17, 17, 14}}, {'V', {17, 17, 17, 17, 17, 10, 4}}, {'W', {17, 17, 17, 21, 21, 21, 10}},
    {'X', {17, 17, 10, 4, 10, 17, 17}},  {'Y', {17, 17, 10, 4, 4, 4, 4}},    {'Z', {31, 1, 2, 4, 8, 16, 31}},
    {'.', {0, 0, 0, 0, 0, 12, 12}},      {',', {0, 0, 0, 0, 12, 4, 8}},      {'+', {0, 4, 4, 31, 4, 4, 0}},
    {'-', {0, 0, 0, 31, 0, 0, 0}},       {'/', {1, 1, 2, 4, 8, 16, 16}},     {':', {0, 12, 12, 0, 12, 12, 0}},
    {'(', {2, 4, 8, 8, 8, 4, 2}},        {')', {8, 4, 2, 2, 2, 4, 8}},       {'%', {24, 25, 2, 4, 8, 19, 3}},
    {'=', {0, 0, 31, 0, 31, 0, 0}},      {'_', {0, 0, 0, 0, 0, 0, 31}},
};

const Glyph* find_glyph(char c) {
  const char upper = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Glyph& g : kFont)
    if (g.c == upper) return &g;
  return nullptr;
}

constexpr int kGlyphAdvance = 6;  // 5 columns and a gap

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}

void put_u32_be(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void put_chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32_be(out, static_cast<uint32_t>(data.size()));
  const size_t type_at = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32_be(out, crc32(out.data() + type_at, out.size() - type_at));  // CRC covers type and data
}

// A zlib stream of stored (uncompressed) deflate blocks of at most 65535 bytes.
std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> z = {0x78, 0x01};  // deflate, 32 KiB window, no dictionary; (0x7801 % 31 == 0)
  size_t at = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - at);
    const bool last = at + n == raw.size();
    z.push_back(last ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    const auto len = static_cast<uint16_t>(n);
    const auto nlen = static_cast<uint16_t>(~len);
    z.insert(z.end(), {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(nlen),
                       static_cast<uint8_t>(nlen >> 8)});
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(at), raw.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  } while (at < raw.size());
  put_u32_be(z, adler32(raw.data(), raw.size()));
  return z;
}

}  // namespace

RgbImage::RgbImage(int width, int height, uint32_t background_rgb) : width_(width), height_(height) {
  if (width < 1 || height < 1 || width > 16384 || height > 16384)
    throw Error("image size " + std::to_string(width) + "x" + std::to_string(height) + " outside [1, 16384]");
  pixels_.resize(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  fill_rect(0, 0, width, height, background_rgb);
}

void RgbImage::set(int x, int y, uint32_t rgb) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  uint8_t* p = &pixels_[(static_cast<size_t>(y) * static_cast<size_t>(width_) + static_cast<size_t>(x)) * 3];
  p[0] = static_cast<uint8_t>(rgb >> 16);
  p[1] = static_cast<uint8_t>(rgb >> 8);
  p[2] = static_cast<uint8_t>(rgb);
}

void RgbImage::fill_rect(int x0, int y0, int x1, int y1, uint32_t rgb) {
  for (int y = std::max(y0, 0); y < std::min(y1, height_); ++y)
    for (int x = std::max(x0, 0); x < std::min(x1, width_); ++x) set(x, y, rgb);
}

int RgbImage::draw_text(int x, int y, const std::string& text, uint32_t rgb, int scale) {
  for (char c : text) {
    if (const Glyph* g = find_glyph(c))
      for (int row = 0; row < 7; ++row)
        for (int col = 0; col < 5; ++col)
          if (g->rows[static_cast<size_t>(row)] & (16 >> col))
            fill_rect(x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale, rgb);
    x += kGlyphAdvance * scale;
  }
  return x;
}

int RgbImage::text_width(const std::string& text, int scale) {
  return static_cast<int>(text.size()) * kGlyphAdvance * scale;
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> encode_png(const RgbImage& image) {
  const auto w = static_cast<size_t>(image.width()), h = static_cast<size_t>(image.height());
  std::vector<uint8_t> raw;  // each scanline: filter type 0 (none), then the RGB bytes
  raw.reserve(h * (1 + 3 * w));
  for (size_t y = 0; y < h; ++y) {
    raw.push_back(0);
    const auto row = image.pixels().begin() + static_cast<std::ptrdiff_t>(y * 3 * w);
    raw.insert(raw.end(), row, row + static_cast<std::ptrdiff_t>(3 * w));
  }
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> header;
  put_u32_be(header, static_cast<uint32_t>(w));
  put_u32_be(header, static_cast<uint32_t>(h));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8 bits per channel, RGB, deflate, adaptive filters, no interlace
  put_chunk(png, "IHDR", header);
  put_chunk(png, "IDAT", zlib_stored(raw));
  put_chunk(png, "IEND", {});
  return png;
}

void write_png(const std::string& path, const RgbImage& image) {
  const std::vector<uint8_t> png = encode_png(image);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  if (!f) throw Error(path + ": cannot write the PNG file");
}

}  // namespace kvserve
