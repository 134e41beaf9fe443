// libFuzzer target: the raw bytes of one HTTP/1.x connection, as the gate
// reads them (server/http_request_reader.h): head, Content-Length and chunked
// bodies, pipelined leftovers. Nothing may throw; memory stays within the
// limits; and the outcome does not depend on how the bytes were split into
// reads (the input's first byte picks the split), so a client cannot trickle
// its way past a check.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "server/http_request_reader.h"

using kvserve::server::HttpRequestLimits;
using kvserve::server::HttpRequestReader;

namespace {

HttpRequestLimits small_limits() {
  HttpRequestLimits l;
  l.max_head_bytes = 512;
  l.max_header_line_bytes = 128;
  l.max_headers = 8;
  l.max_body_bytes = 1024;
  return l;
}

void check_bounded(const HttpRequestReader& r, const HttpRequestLimits& l, size_t input_bytes) {
  // head + body (a chunked body grows by doubling) + a chunk line, and leftovers only after completion.
  if (r.buffered_bytes() > l.max_head_bytes + 2 * l.max_body_bytes + 2048 + input_bytes * (r.state() == HttpRequestReader::State::kComplete))
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 17;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const HttpRequestLimits limits = small_limits();

  HttpRequestReader whole(limits);
  whole.feed(bytes);
  check_bounded(whole, limits, bytes.size());
  HttpRequestReader split(limits);
  for (size_t at = 0; at < bytes.size(); at += step) {
    split.feed(bytes.substr(at, step));
    check_bounded(split, limits, bytes.size());
    if (split.wants_continue()) split.continue_sent();
  }

  using State = HttpRequestReader::State;
  const bool whole_done = whole.state() == State::kComplete, split_done = split.state() == State::kComplete;
  if (whole_done != split_done) std::abort();
  if ((whole.state() == State::kRefused) != (split.state() == State::kRefused)) std::abort();
  if (whole.state() == State::kRefused && (whole.refusal_status() < 400 || whole.refusal_status() > 599)) std::abort();
  if (!whole_done) return 0;
  const HttpRequestReader::Request a = whole.take_request(), b = split.take_request();
  if (a.head != b.head || a.body != b.body || whole.take_leftover() != split.take_leftover()) std::abort();
  // A canonical request: one CRLF CRLF, at its end, and a body within the limit.
  if (a.head.find("\r\n\r\n") != a.head.size() - 4 || a.body.size() > limits.max_body_bytes) std::abort();
  if (a.head.find("Content-Length: " + std::to_string(a.body.size()) + "\r\n\r\n") == std::string::npos) std::abort();
  // httplib gets it whole: reading it again gives the same request.
  HttpRequestLimits roomier = limits;  // the canonical head has one Content-Length more
  roomier.max_headers += 1;
  roomier.max_head_bytes += 64;
  HttpRequestReader again(roomier);
  again.feed(a.head + a.body);
  if (again.state() != State::kComplete) std::abort();
  const HttpRequestReader::Request c = again.take_request();
  if (c.head != a.head || c.body != a.body) std::abort();
  return 0;
}
