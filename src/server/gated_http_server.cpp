#include "server/gated_http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace kvserve::server {
namespace {

bool numeric_address(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

// httplib's Stream over a connected socket: reads are buffered (httplib reads
// request lines a byte at a time) and both directions wait at most their
// timeout for the socket to be ready.
class SocketStream final : public httplib::Stream {
 public:
  SocketStream(int sock, time_t read_timeout_sec, time_t write_timeout_sec)
      : sock_(sock), read_timeout_ms_(static_cast<int>(read_timeout_sec * 1000)),
        write_timeout_ms_(static_cast<int>(write_timeout_sec * 1000)) {}

  bool is_readable() const override { return buffered_ < filled_ || wait(POLLIN, read_timeout_ms_); }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (buffered_ == filled_) {
      if (!wait(POLLIN, read_timeout_ms_)) return -1;
      const ssize_t n = recv(sock_, buffer_.data(), buffer_.size(), 0);
      if (n <= 0) return n;
      buffered_ = 0;
      filled_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, filled_ - buffered_);
    std::memcpy(ptr, buffer_.data() + buffered_, n);
    buffered_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return send(sock_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || !numeric_address(addr, len, ip, port))
      port = -1;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || !numeric_address(addr, len, ip, port))
      port = -1;
  }
  socket_t socket() const override { return sock_; }
  // Bytes read past the request (a pipelined next one).
  bool has_buffered() const { return buffered_ < filled_; }

 private:
  // Ready for `events` within timeout_ms, and not hung up (a client that
  // closed its end gets no more writes: that ends its stream).
  bool wait(short events, int timeout_ms) const {
    pollfd p{sock_, static_cast<short>(events | POLLRDHUP), 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    if (events == POLLOUT && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) return false;
    return (p.revents & (events | POLLHUP | POLLRDHUP)) != 0;  // reads see the end of stream as 0 bytes
  }

  int sock_;
  int read_timeout_ms_, write_timeout_ms_;
  std::array<char, 4096> buffer_{};
  size_t buffered_ = 0, filled_ = 0;  // unread bytes are buffer_[buffered_, filled_)
};

}  // namespace

GatedHttpServer::GatedHttpServer(ConnectionGateLimits limits, size_t worker_threads)
    : gate_(limits, [this](int sock) {
        // The gate's thread: queue the connection for a worker, never block.
        httplib::TaskQueue* pool = pool_.load();
        if (pool == nullptr) {
          close(sock);
          return;
        }
        pool->enqueue([this, sock] { serve(sock); });
      }) {
  new_task_queue = [this, worker_threads] {
    auto* pool = new httplib::ThreadPool(worker_threads);
    pool_ = pool;
    return pool;
  };
}

GatedHttpServer::~GatedHttpServer() { close_gate(); }

void GatedHttpServer::close_gate() { gate_.stop(); }

bool GatedHttpServer::process_and_close_socket(socket_t sock) {
  gate_.admit(sock);
  return true;
}

void GatedHttpServer::serve(int sock) {
  SocketStream stream(sock, read_timeout_sec_, write_timeout_sec_);
  std::pair<std::string, int> peer;
  stream.get_remote_ip_and_port(peer.first, peer.second);
  {
    std::lock_guard lock(mutex_);
    live_[peer] = sock;
  }
  bool client_closes = false;
  const bool answered = process_request(stream, !is_running(), client_closes, nullptr);
  {
    std::lock_guard lock(mutex_);
    live_.erase(peer);
  }
  if (answered && !client_closes && !stream.has_buffered() && is_running()) {
    gate_.admit(sock);  // kept alive: wait for the next request in the gate, not on this worker
    return;
  }
  shutdown(sock, SHUT_RDWR);
  close(sock);
}

int GatedHttpServer::socket_of(const httplib::Request& req) const {
  std::lock_guard lock(mutex_);
  const auto it = live_.find({req.remote_addr, req.remote_port});
  return it == live_.end() ? -1 : it->second;
}

}  // namespace kvserve::server
