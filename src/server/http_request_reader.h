#pragma once
// Reads one HTTP/1.x request from a connection's bytes as they arrive, under
// fixed limits, and turns it into a canonical request for httplib: CRLF lines,
// no Transfer-Encoding, no Expect, one Content-Length. httplib 0.11 itself has
// no bound on a header line, skips lines that do not end in CRLF and reads a
// chunked or unsized body for as long as the client sends, so nothing but
// such a canonical request may reach it (docs/reliability.md).
#include <cstddef>
#include <string>
#include <string_view>

namespace kvserve::server {

struct HttpRequestLimits {
  size_t max_head_bytes = 16384;        // request line + headers + the empty line, else 431
  size_t max_header_line_bytes = 8192;  // one line of the head, else 431
  size_t max_headers = 100;             // header lines, else 431
  size_t max_body_bytes = 16 << 20;     // Content-Length or decoded chunks, else 413
};

class HttpRequestReader {
 public:
  enum class State {
    kHead,      // waiting for the rest of the head
    kBody,      // head accepted, waiting for body bytes
    kComplete,  // take_request() holds the whole request
    kRefused,   // refusal_status() / refusal_message() say why
  };

  explicit HttpRequestReader(const HttpRequestLimits& limits);

  // Takes the next bytes received. Bytes past the end of the request are kept
  // for the next one (take_leftover()); after kComplete or kRefused nothing is
  // parsed any more.
  void feed(std::string_view bytes);

  State state() const { return state_; }
  int refusal_status() const { return refusal_status_; }
  const std::string& refusal_message() const { return refusal_message_; }

  // Known once the head is accepted (state kBody or kComplete).
  const std::string& method() const { return method_; }
  const std::string& target() const { return target_; }
  bool chunked() const { return chunked_; }
  // The body the head announces by Content-Length (0 for none or chunked).
  size_t announced_body_bytes() const { return chunked_ ? 0 : content_length_; }
  // The client sent Expect: 100-continue and its body has not arrived yet:
  // the caller should answer "100 Continue" once (then call continue_sent()).
  bool wants_continue() const { return wants_continue_ && state_ == State::kBody && body_.empty(); }
  void continue_sent() { wants_continue_ = false; }

  // Bytes this reader holds now, the room reserved for an announced body
  // included (what a memory budget charges it).
  size_t buffered_bytes() const { return head_.size() + body_.capacity() + line_.size() + leftover_.size(); }

  // The canonical request, once kComplete: its head (ending in the empty
  // line, with one Content-Length) and its body; leaves both empty.
  struct Request {
    std::string head, body;
  };
  Request take_request();
  // The bytes received past the end of the request.
  std::string take_leftover();

 private:
  size_t feed_head(std::string_view bytes);
  void accept_head();
  bool accept_request_line(std::string_view line);
  bool accept_header(std::string_view line);
  size_t feed_body(std::string_view bytes);
  size_t feed_chunked(std::string_view bytes);
  void chunk_line_done(std::string_view line);
  void refuse(int status, std::string message);
  void finish();

  enum class ChunkState { kSize, kData, kDataEnd, kTrailer };

  HttpRequestLimits limits_;
  State state_ = State::kHead;
  int refusal_status_ = 0;
  std::string refusal_message_;
  std::string head_;           // raw head bytes, then (accepted) the canonical head without its length
  size_t scanned_ = 0;         // head_ bytes already checked for a line end
  size_t head_begin_ = 0;      // past the empty lines a client may send before a request line
  size_t line_start_ = 0;      // where the head's current line starts
  size_t header_lines_ = 0;
  std::string method_, target_;
  bool has_length_ = false, chunked_ = false, wants_continue_ = false;
  size_t content_length_ = 0;
  std::string body_;
  ChunkState chunk_state_ = ChunkState::kSize;
  size_t chunk_left_ = 0;      // data bytes of the current chunk still to come
  std::string line_;           // a chunk-size or trailer line being received
  size_t trailer_bytes_ = 0;
  std::string leftover_;
};

}  // namespace kvserve::server
