#pragma once
// A dependency-free PNG encoder for 8-bit RGB images (benchmark plots): the
// zlib stream uses uncompressed "stored" deflate blocks, so no compressor is
// needed, only the CRC-32 each chunk carries and the stream's Adler-32.
#include <cstdint>
#include <string>
#include <vector>

namespace kvserve {

// An RGB raster, row-major, 3 bytes per pixel, (0, 0) top left.
class RgbImage {
 public:
  // Throws kvserve::Error unless both sizes are in [1, 16384].
  RgbImage(int width, int height, uint32_t background_rgb);
  int width() const { return width_; }
  int height() const { return height_; }
  // Pixels outside the image are ignored, so shapes may be clipped freely.
  void set(int x, int y, uint32_t rgb);
  void fill_rect(int x0, int y0, int x1, int y1, uint32_t rgb);  // [x0, x1) x [y0, y1)
  // Draws `text` with a built-in 5x7 font scaled by `scale`; characters the
  // font lacks are left blank. Returns the x just past the text.
  int draw_text(int x, int y, const std::string& text, uint32_t rgb, int scale = 1);
  static int text_width(const std::string& text, int scale = 1);
  const std::vector<uint8_t>& pixels() const { return pixels_; }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t n);

std::vector<uint8_t> encode_png(const RgbImage& image);
// Throws kvserve::Error naming the path when it cannot be written.
void write_png(const std::string& path, const RgbImage& image);

}  // namespace kvserve
