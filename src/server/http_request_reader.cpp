#include "server/http_request_reader.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace kvserve::server {
namespace {

constexpr size_t kMaxChunkSizeLine = 1024;  // hex digits and chunk extensions

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) { return std::tolower(x) == std::tolower(y); });
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 9110 token characters (method and header names).
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!std::isalnum(c) && std::strchr("!#$%&'*+-.^_`|~", c) == nullptr) return false;
  return true;
}

// No control characters but horizontal tab (obs-text, bytes >= 0x80, is allowed).
bool is_field_value(std::string_view s) {
  return std::none_of(s.begin(), s.end(), [](unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; });
}

bool is_target(std::string_view s) {
  return !s.empty() && std::none_of(s.begin(), s.end(), [](unsigned char c) { return c <= 0x20 || c == 0x7f; });
}

int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

HttpRequestReader::HttpRequestReader(const HttpRequestLimits& limits) : limits_(limits) {
  limits_.max_head_bytes = std::max<size_t>(limits_.max_head_bytes, 16);
  limits_.max_header_line_bytes = std::max<size_t>(limits_.max_header_line_bytes, 16);
}

void HttpRequestReader::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    if (state_ == State::kRefused) return;
    if (state_ == State::kComplete) {
      leftover_.append(bytes);
      return;
    }
    const size_t used = state_ == State::kHead ? feed_head(bytes) : chunked_ ? feed_chunked(bytes) : feed_body(bytes);
    bytes.remove_prefix(used);
  }
}

size_t HttpRequestReader::feed_head(std::string_view bytes) {
  const size_t old_size = head_.size();
  const size_t take = std::min(bytes.size(), limits_.max_head_bytes - old_size);
  head_.append(bytes.substr(0, take));
  for (; scanned_ < head_.size(); ++scanned_) {
    if (head_[scanned_] != '\n') continue;
    if (scanned_ == 0 || head_[scanned_ - 1] != '\r') {
      refuse(400, "a line of the request head ends in a bare LF; HTTP lines end in CRLF");
      return take;
    }
    const size_t line_bytes = scanned_ + 1 - line_start_;
    if (line_bytes == 2 && line_start_ == head_begin_) {  // an empty line before the request line: ignored (RFC 9112)
      head_begin_ = line_start_ = scanned_ + 1;
      continue;
    }
    if (line_bytes == 2) {  // the empty line: the head is complete
      head_.resize(scanned_ + 1);
      accept_head();
      return scanned_ + 1 - old_size;
    }
    if (line_bytes > limits_.max_header_line_bytes + 2) {
      refuse(431, "a line of the request head is longer than " + std::to_string(limits_.max_header_line_bytes) + " bytes");
      return take;
    }
    if (++header_lines_ > limits_.max_headers + 1) {  // + the request line
      refuse(431, "the request has more than " + std::to_string(limits_.max_headers) + " header lines");
      return take;
    }
    line_start_ = scanned_ + 1;
  }
  if (head_.size() - line_start_ > limits_.max_header_line_bytes + 1)
    refuse(431, "a line of the request head is longer than " + std::to_string(limits_.max_header_line_bytes) + " bytes");
  else if (head_.size() >= limits_.max_head_bytes)
    refuse(431, "the request line and headers exceed " + std::to_string(limits_.max_head_bytes) + " bytes");
  return take;
}

void HttpRequestReader::accept_head() {
  std::string_view head(head_);
  head.remove_prefix(head_begin_);
  head.remove_suffix(2);  // the empty line
  std::string canonical;
  canonical.reserve(head.size() + 32);
  bool first = true;
  while (!head.empty()) {
    const size_t end = head.find("\r\n");  // every line of the head ends in CRLF (feed_head checked)
    const std::string_view line = head.substr(0, end);
    head.remove_prefix(end + 2);
    if (first ? !accept_request_line(line) : !accept_header(line)) return;
    // The framing headers are the gate's: httplib sees the one Content-Length finish() writes.
    const std::string_view name = line.substr(0, line.find(':'));
    if (first || !(iequals(name, "content-length") || iequals(name, "transfer-encoding") || iequals(name, "expect")))
      canonical.append(line).append("\r\n");
    first = false;
  }
  if (has_length_ && chunked_) return refuse(400, "a request cannot have both Content-Length and Transfer-Encoding");
  if (!chunked_ && content_length_ > limits_.max_body_bytes)
    return refuse(413, "the request body is larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
  head_ = std::move(canonical);
  state_ = State::kBody;
  if (!chunked_) {
    if (content_length_ == 0) return finish();
    body_.reserve(content_length_);  // the caller's budget has counted it already (buffered_bytes())
  }
}

bool HttpRequestReader::accept_request_line(std::string_view line) {
  const size_t space = line.find(' ');
  const size_t second = space == std::string_view::npos ? space : line.find(' ', space + 1);
  if (second == std::string_view::npos) {
    refuse(400, "the request line is not \"METHOD target HTTP/1.1\"");
    return false;
  }
  const std::string_view method = line.substr(0, space), target = line.substr(space + 1, second - space - 1),
                         version = line.substr(second + 1);
  if (!is_token(method) || !is_target(target)) {
    refuse(400, "the request line is not \"METHOD target HTTP/1.1\"");
    return false;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.substr(0, 5) == "HTTP/") refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
    else refuse(400, "the request line is not \"METHOD target HTTP/1.1\"");
    return false;
  }
  method_ = method;
  target_ = target;
  return true;
}

bool HttpRequestReader::accept_header(std::string_view line) {
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
    refuse(400, "a header line is not \"Name: value\" (no folded lines, no space before the colon)");
    return false;
  }
  const std::string_view name = line.substr(0, colon), value = trim_ows(line.substr(colon + 1));
  if (!is_field_value(value)) {
    refuse(400, "a header value has a control character");
    return false;
  }
  if (iequals(name, "content-length")) {
    if (has_length_) {
      refuse(400, "the request has more than one Content-Length");
      return false;
    }
    has_length_ = true;
    if (value.empty() || value.find_first_not_of("0123456789") != std::string_view::npos) {
      refuse(400, "Content-Length is not a non-negative decimal number");
      return false;
    }
    content_length_ = 0;
    for (char c : value) content_length_ = std::min<size_t>(content_length_ * 10 + static_cast<size_t>(c - '0'), size_t{1} << 62);
  } else if (iequals(name, "transfer-encoding")) {
    if (chunked_) {
      refuse(400, "the request has more than one Transfer-Encoding");
      return false;
    }
    if (!iequals(value, "chunked")) {
      refuse(501, "the only transfer coding served is chunked");
      return false;
    }
    chunked_ = true;
  } else if (iequals(name, "expect")) {
    if (!iequals(value, "100-continue")) {
      refuse(417, "the only expectation served is 100-continue");
      return false;
    }
    wants_continue_ = true;
  }
  return true;
}

size_t HttpRequestReader::feed_body(std::string_view bytes) {
  const size_t take = std::min(bytes.size(), content_length_ - body_.size());
  body_.append(bytes.substr(0, take));
  if (body_.size() == content_length_) finish();
  return take;
}

size_t HttpRequestReader::feed_chunked(std::string_view bytes) {
  size_t used = 0;
  while (used < bytes.size() && state_ == State::kBody) {
    const std::string_view rest = bytes.substr(used);
    switch (chunk_state_) {
      case ChunkState::kData: {
        const size_t take = std::min(chunk_left_, rest.size());
        body_.append(rest.substr(0, take));
        chunk_left_ -= take;
        used += take;
        if (chunk_left_ == 0) chunk_state_ = ChunkState::kDataEnd;
        break;
      }
      case ChunkState::kDataEnd:  // the CRLF after a chunk's data
        line_.push_back(rest[0]);
        ++used;
        if (line_[0] != '\r' || (line_.size() == 2 && line_[1] != '\n')) {
          refuse(400, "a chunk's data is not followed by CRLF");
        } else if (line_.size() == 2) {
          line_.clear();
          chunk_state_ = ChunkState::kSize;
        }
        break;
      case ChunkState::kSize:
      case ChunkState::kTrailer: {
        const size_t newline = rest.find('\n');
        const size_t take = newline == std::string_view::npos ? rest.size() : newline + 1;
        const size_t cap = chunk_state_ == ChunkState::kSize ? kMaxChunkSizeLine : limits_.max_header_line_bytes;
        if (line_.size() + take > cap + 2) {
          refuse(chunk_state_ == ChunkState::kSize ? 400 : 431, "a chunk size or trailer line is too long");
          break;
        }
        line_.append(rest.substr(0, take));
        used += take;
        if (newline == std::string_view::npos) break;
        if (line_.size() < 2 || line_[line_.size() - 2] != '\r') {
          refuse(400, "a chunk size or trailer line ends in a bare LF; HTTP lines end in CRLF");
          break;
        }
        line_.resize(line_.size() - 2);
        const std::string line = std::move(line_);
        line_.clear();
        chunk_line_done(line);
        break;
      }
    }
  }
  return used;
}

void HttpRequestReader::chunk_line_done(std::string_view line) {
  if (chunk_state_ == ChunkState::kTrailer) {  // trailer fields are dropped: nothing here reads them
    if (line.empty()) {
      finish();
      return;
    }
    trailer_bytes_ += line.size() + 2;
    if (trailer_bytes_ > limits_.max_head_bytes)
      refuse(431, "the chunked body's trailer exceeds " + std::to_string(limits_.max_head_bytes) + " bytes");
    return;
  }
  const std::string_view digits = trim_ows(line.substr(0, line.find(';')));
  if (digits.empty()) {
    refuse(400, "a chunk size is missing");
    return;
  }
  size_t size = 0;
  for (unsigned char c : digits) {
    const int v = hex_value(c);
    if (v < 0) {
      refuse(400, "a chunk size is not a hexadecimal number");
      return;
    }
    if (size > (limits_.max_body_bytes >> 4) + 1) size = limits_.max_body_bytes + 1;  // saturate: refused below
    else size = size * 16 + static_cast<size_t>(v);
  }
  if (size > limits_.max_body_bytes - body_.size()) {
    refuse(413, "the request body is larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
    return;
  }
  chunk_left_ = size;
  chunk_state_ = size == 0 ? ChunkState::kTrailer : ChunkState::kData;
}

void HttpRequestReader::refuse(int status, std::string message) {
  state_ = State::kRefused;
  refusal_status_ = status;
  refusal_message_ = std::move(message);
  // Nothing more will be parsed: drop what was held.
  std::string().swap(head_);
  std::string().swap(body_);
  std::string().swap(line_);
}

void HttpRequestReader::finish() {
  state_ = State::kComplete;
  head_ += "Content-Length: " + std::to_string(body_.size()) + "\r\n\r\n";
}

HttpRequestReader::Request HttpRequestReader::take_request() {
  Request r{std::move(head_), std::move(body_)};
  head_.clear();
  body_.clear();
  return r;
}

std::string HttpRequestReader::take_leftover() {
  std::string r = std::move(leftover_);
  leftover_.clear();
  return r;
}

}  // namespace kvserve::server
