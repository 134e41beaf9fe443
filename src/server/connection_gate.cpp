#include "server/connection_gate.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "server/api_error.h"

namespace kvserve::server {
namespace {

// A refused client's connection is read (and discarded) this long after the
// answer: closing with its bytes unread would send a reset that can destroy
// the answer before the client reads it.
constexpr std::chrono::milliseconds kLinger{1000};
constexpr size_t kReadBufferBytes = 64 << 10;

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 505: return "HTTP Version Not Supported";
    default: return "Service Unavailable";
  }
}

HttpRequestLimits request_limits(const ConnectionGateLimits& limits) {
  HttpRequestLimits r;
  r.max_head_bytes = limits.max_head_bytes;
  r.max_header_line_bytes = limits.max_header_line_bytes;
  r.max_headers = limits.max_headers;
  r.max_body_bytes = limits.max_body_bytes;
  return r;
}

}  // namespace

ConnectionGate::ConnectionGate(ConnectionGateLimits limits, std::function<void(std::shared_ptr<ReceivedRequest>)> ready)
    : limits_(limits), request_limits_(request_limits(limits)), ready_(std::move(ready)) {
  limits_.max_held = std::max<size_t>(limits_.max_held, 1);
  // One request of the largest size always fits (--max-body-bytes may be set past the budget).
  limits_.max_buffered_bytes = std::max(limits_.max_buffered_bytes, limits_.max_body_bytes + 2 * kReadBufferBytes);
  read_buffer_.resize(kReadBufferBytes);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) throw Error(std::string("cannot create the connection gate: ") + std::strerror(errno));
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = wake_fd_;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &e) != 0)
    throw Error(std::string("cannot create the connection gate: ") + std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

ConnectionGate::~ConnectionGate() {
  stop();
  close(epoll_fd_);
  close(wake_fd_);
}

void ConnectionGate::admit(int sock, std::string received) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      admitted_.emplace_back(sock, std::move(received));
      const uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
      return;
    }
  }
  close(sock);
}

void ConnectionGate::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  while (!held_.empty()) drop(held_.begin()->first);
  std::lock_guard lock(mutex_);
  for (const auto& admitted : admitted_) close(admitted.first);
  admitted_.clear();
}

void ConnectionGate::run() {
  std::vector<epoll_event> events(256);
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t count;
        [[maybe_unused]] const ssize_t r = read(wake_fd_, &count, sizeof count);
        continue;
      }
      read_from(events[i].data.fd);
    }
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    take_admitted();
    expire(Clock::now());
  }
}

void ConnectionGate::take_admitted() {
  std::vector<std::pair<int, std::string>> admitted;
  {
    std::lock_guard lock(mutex_);
    admitted.swap(admitted_);
  }
  for (auto& [sock, received] : admitted) hold(sock, std::move(received));
}

void ConnectionGate::hold(int sock, std::string received) {
  if (held_.size() >= limits_.max_held) {
    const auto oldest = std::min_element(held_.begin(), held_.end(),
                                         [](const auto& a, const auto& b) { return a.second.since < b.second.since; });
    if (oldest->second.closing) drop(oldest->first);
    else refuse(oldest->first, 503, "too many connections are waiting to send their request; try again");
  }
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP | EPOLLET;  // edge-triggered: every wake-up reads until the socket is empty
  e.data.fd = sock;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, sock, &e) != 0) {
    close(sock);
    return;
  }
  const auto now = Clock::now();
  Held& held = held_.try_emplace(sock, Held{now, std::nullopt, HttpRequestReader(request_limits_)}).first->second;
  if (!received.empty()) {  // a pipelined request, read with the previous one
    held.first_byte = now;
    held.reader.feed(received);
    if (!settle(sock, held)) return;
  }
  read_from(sock);
}

void ConnectionGate::read_from(int sock) {
  for (;;) {
    const auto it = held_.find(sock);
    if (it == held_.end()) return;
    Held& held = it->second;
    if (held.closing) return drain(sock);
    const ssize_t n = recv(sock, read_buffer_.data(), read_buffer_.size(), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return drop(sock);  // closed or reset before sending a whole request
    if (!held.first_byte) held.first_byte = Clock::now();
    held.reader.feed(std::string_view(read_buffer_.data(), static_cast<size_t>(n)));
    if (!settle(sock, held)) return;
  }
}

// Charges the reader's bytes to the budget and acts on its state; false once
// the connection left (handed to a worker, refused or closed).
bool ConnectionGate::settle(int sock, Held& held) {
  const size_t bytes = held.reader.buffered_bytes(), old = held.charged;
  held.charged = bytes;
  if (bytes < old) *buffered_ -= old - bytes;
  // Past the budget the request is refused rather than left unread: a
  // connection we stop reading would keep its slot and reach 408 anyway,
  // telling the client nothing, while 503 + Retry-After frees the memory at
  // once and says when to come back.
  if (bytes > old && buffered_->fetch_add(bytes - old) + (bytes - old) > limits_.max_buffered_bytes &&
      held.reader.state() != HttpRequestReader::State::kRefused) {
    refuse(sock, 503, "the server holds too many request bytes at once; try again shortly");
    return false;
  }
  switch (held.reader.state()) {
    case HttpRequestReader::State::kRefused:
      refuse(sock, held.reader.refusal_status(), held.reader.refusal_message());
      return false;
    case HttpRequestReader::State::kComplete: {
      auto request = std::make_shared<ReceivedRequest>();
      request->sock = sock;
      request->method = held.reader.method();
      request->target = held.reader.target();
      request->request = held.reader.take_request();
      request->leftover = held.reader.take_leftover();
      request->charge = ByteCharge(buffered_, held.charged);
      held.charged = 0;
      release(sock);
      ready_(std::move(request));
      return false;
    }
    case HttpRequestReader::State::kBody:
      if (held.reader.wants_continue()) {  // answered here, so httplib never sees the Expect header
        static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        [[maybe_unused]] const ssize_t sent = send(sock, kContinue, sizeof kContinue - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        held.reader.continue_sent();
      }
      return true;
    case HttpRequestReader::State::kHead:
      return true;
  }
  return true;
}

void ConnectionGate::drain(int sock) {
  for (int i = 0; i < 64; ++i) {
    const ssize_t n = recv(sock, read_buffer_.data(), read_buffer_.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return drop(sock);
  }
}

void ConnectionGate::expire(Clock::time_point now) {
  std::vector<int> idle, late;
  for (const auto& [sock, held] : held_) {
    if (held.closing ? now - held.since >= kLinger : !held.first_byte && now - held.since >= limits_.idle_timeout)
      idle.push_back(sock);
    else if (!held.closing && held.first_byte && now - *held.first_byte >= limits_.request_deadline)
      late.push_back(sock);
  }
  for (int sock : idle) drop(sock);  // nothing was asked (or all was answered): close quietly
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limits_.request_deadline).count();
  for (int sock : late) refuse(sock, 408, "the request did not arrive within " + std::to_string(ms) + " ms");
}

void ConnectionGate::release(int sock) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, sock, nullptr);
  const auto it = held_.find(sock);
  if (it == held_.end()) return;
  *buffered_ -= it->second.charged;
  held_.erase(it);
}

void ConnectionGate::drop(int sock) {
  release(sock);
  close(sock);
}

void ConnectionGate::refuse(int sock, int status, const std::string& message) {
  const auto it = held_.find(sock);
  if (it == held_.end()) return;
  Held& held = it->second;
  const std::string body = dump_json(error_body(ApiError(status, message)));
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
                               "\r\nContent-Type: application/json\r\nConnection: close\r\n" +
                               (status == 503 ? "Retry-After: 1\r\n" : "") +
                               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] const ssize_t sent = send(sock, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(sock, SHUT_WR);
  held.reader = HttpRequestReader(request_limits_);  // frees what the request held
  *buffered_ -= held.charged;
  held.charged = 0;
  held.closing = true;
  held.since = Clock::now();
  drain(sock);
}

}  // namespace kvserve::server
