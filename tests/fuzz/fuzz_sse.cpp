// libFuzzer target: the benchmark client's Server-Sent Events parser. The
// same bytes fed whole and fed in pieces (cut where the input's first byte
// says) must give the same events.
#include <cstdlib>
#include <string>
#include <vector>

#include "loadgen/sse_parser.h"

using kvserve::loadgen::SseParser;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t piece = data[0] % 16 + 1;
  std::vector<std::string> whole, pieces;
  SseParser a, b;
  a.feed(stream, [&](const std::string& event) { whole.push_back(event); });
  for (size_t at = 0; at < stream.size(); at += piece)
    b.feed(stream.substr(at, piece), [&](const std::string& event) { pieces.push_back(event); });
  if (whole != pieces || a.has_partial_event() != b.has_partial_event()) std::abort();
  return 0;
}
