#include "server/connection_gate.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "server/api_error.h"

namespace kvserve::server {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](unsigned char x, unsigned char y) { return std::tolower(x) == std::tolower(y); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// The body bytes the head announces; 0 when none. A head a worker must see at
// once (chunked body, Expect: 100-continue, an unreadable length) gives nullopt.
std::optional<size_t> announced_body(std::string_view head) {
  size_t length = 0;
  size_t start = head.find('\n');  // skip the request line
  while (start != std::string_view::npos && start + 1 < head.size()) {
    const size_t end = head.find('\n', start + 1);
    const std::string_view line = head.substr(start + 1, end == std::string_view::npos ? end : end - start - 1);
    start = end;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (iequals(name, "transfer-encoding") || iequals(name, "expect")) return std::nullopt;
    if (!iequals(name, "content-length")) continue;
    if (value.empty() || value.size() > 12 || value.find_first_not_of("0123456789") != std::string_view::npos)
      return std::nullopt;
    length = 0;
    for (char c : value) length = length * 10 + static_cast<size_t>(c - '0');
  }
  return length;
}

}  // namespace

RequestHead classify_request_bytes(std::string_view bytes, const ConnectionGateLimits& limits) {
  const size_t crlf = bytes.find("\r\n\r\n"), lf = bytes.find("\n\n");
  size_t head_bytes = crlf == std::string_view::npos ? std::string_view::npos : crlf + 4;
  if (lf != std::string_view::npos && (head_bytes == std::string_view::npos || lf + 2 < head_bytes)) head_bytes = lf + 2;
  if (head_bytes == std::string_view::npos)
    return bytes.size() >= limits.max_head_bytes ? RequestHead::kTooLong : RequestHead::kIncomplete;
  if (head_bytes > limits.max_head_bytes) return RequestHead::kTooLong;
  const std::optional<size_t> body = announced_body(bytes.substr(0, head_bytes));
  if (!body) return RequestHead::kReady;
  if (*body > limits.max_body_bytes) return RequestHead::kBodyTooLarge;
  const size_t wanted = std::min(limits.max_peek_bytes, head_bytes + std::min(*body, limits.max_peek_bytes));
  return bytes.size() >= wanted ? RequestHead::kReady : RequestHead::kIncomplete;
}

ConnectionGate::ConnectionGate(ConnectionGateLimits limits, std::function<void(int)> ready)
    : limits_(limits), ready_(std::move(ready)) {
  limits_.max_peek_bytes = std::max(limits_.max_peek_bytes, limits_.max_head_bytes);
  limits_.max_held = std::max<size_t>(limits_.max_held, 1);
  peek_buffer_.resize(limits_.max_peek_bytes);
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

void ConnectionGate::admit(int sock) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      admitted_.push_back(sock);
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
  for (const auto& [sock, held] : held_) close(sock);
  held_.clear();
  std::lock_guard lock(mutex_);
  for (int sock : admitted_) close(sock);
  admitted_.clear();
  held_count_ = 0;
}

size_t ConnectionGate::held() const {
  std::lock_guard lock(mutex_);
  return held_count_;
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
      check(events[i].data.fd, (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
    }
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    take_admitted();
    expire(Clock::now());
    std::lock_guard lock(mutex_);
    held_count_ = held_.size();
  }
}

void ConnectionGate::take_admitted() {
  std::vector<int> admitted;
  {
    std::lock_guard lock(mutex_);
    admitted.swap(admitted_);
  }
  for (int sock : admitted) hold(sock);
}

void ConnectionGate::hold(int sock) {
  if (held_.size() >= limits_.max_held) {
    const auto oldest = std::min_element(held_.begin(), held_.end(),
                                         [](const auto& a, const auto& b) { return a.second.since < b.second.since; });
    refuse(oldest->first, 503, "too many connections are waiting to send their request; try again");
  }
  epoll_event e{};
  e.events = EPOLLIN | EPOLLRDHUP | EPOLLET;  // edge-triggered: woken by new bytes, not by those already peeked
  e.data.fd = sock;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, sock, &e) != 0) {
    close(sock);
    return;
  }
  held_[sock] = Held{Clock::now()};
  check(sock, false);
}

void ConnectionGate::check(int sock, bool hung_up) {
  const auto it = held_.find(sock);
  if (it == held_.end()) return;
  const ssize_t n = recv(sock, peek_buffer_.data(), peek_buffer_.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {  // closed or reset before sending a whole request
    release(sock);
    close(sock);
    return;
  }
  switch (classify_request_bytes(std::string_view(peek_buffer_.data(), static_cast<size_t>(n)), limits_)) {
    case RequestHead::kReady:
      release(sock);
      ready_(sock);
      return;
    case RequestHead::kTooLong:
      refuse(sock, 431, "the request line and headers exceed " + std::to_string(limits_.max_head_bytes) + " bytes");
      return;
    case RequestHead::kBodyTooLarge:
      refuse(sock, 413, "the request body is larger than " + std::to_string(limits_.max_body_bytes) + " bytes");
      return;
    case RequestHead::kIncomplete:
      it->second.got_bytes = true;
      if (hung_up) {  // the client stopped sending: the request can never complete
        release(sock);
        close(sock);
      }
      return;
  }
}

void ConnectionGate::expire(Clock::time_point now) {
  std::vector<int> idle, late;
  for (const auto& [sock, held] : held_) {
    if (!held.got_bytes && now - held.since >= limits_.idle_timeout) idle.push_back(sock);
    else if (held.got_bytes && now - held.since >= limits_.request_deadline) late.push_back(sock);
  }
  for (int sock : idle) {  // nothing was asked: close quietly, as for an idle kept-alive connection
    release(sock);
    close(sock);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(limits_.request_deadline).count();
  for (int sock : late) refuse(sock, 408, "the request did not arrive within " + std::to_string(ms) + " ms");
}

void ConnectionGate::release(int sock) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, sock, nullptr);
  held_.erase(sock);
}

void ConnectionGate::refuse(int sock, int status, const std::string& message) {
  release(sock);
  const char* reason = status == 408   ? "Request Timeout"
                       : status == 413 ? "Payload Too Large"
                       : status == 431 ? "Request Header Fields Too Large"
                                       : "Service Unavailable";
  const std::string body = dump_json(error_body(ApiError(status, message)));
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                               "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] const ssize_t sent = send(sock, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  // Unread bytes at close() would turn the FIN into a reset that can discard
  // the answer before the client reads it.
  for (int i = 0; i < 16 && recv(sock, peek_buffer_.data(), peek_buffer_.size(), MSG_DONTWAIT) > 0; ++i) {
  }
  shutdown(sock, SHUT_WR);
  close(sock);
}

}  // namespace kvserve::server
