#include "server/gated_http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

// httplib's Stream for one request the gate has read whole: reads come from
// that request in memory (end of stream after it), so a worker never waits on
// a client's bytes; writes go to the socket, each waiting at most its timeout
// for room.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(int sock, const HttpRequestReader::Request& request, time_t write_timeout_sec)
      : sock_(sock), request_(request), write_timeout_ms_(static_cast<int>(write_timeout_sec * 1000)) {}

  bool is_readable() const override { return true; }  // reads never block (0 at the end)
  bool is_writable() const override { return wait_writable(); }

  ssize_t read(char* ptr, size_t size) override {
    const std::string& part = read_ < request_.head.size() ? request_.head : request_.body;
    const size_t offset = read_ < request_.head.size() ? read_ : read_ - request_.head.size();
    const size_t n = std::min(size, part.size() - std::min(offset, part.size()));
    std::memcpy(ptr, part.data() + offset, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!wait_writable()) return -1;
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

 private:
  // Room to write within the timeout, and not hung up (a client that closed
  // its end gets no more writes: that ends its stream).
  bool wait_writable() const {
    pollfd p{sock_, static_cast<short>(POLLOUT | POLLRDHUP), 0};
    if (poll(&p, 1, write_timeout_ms_) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return false;
    return (p.revents & POLLOUT) != 0;
  }

  int sock_;
  const HttpRequestReader::Request& request_;
  int write_timeout_ms_;
  size_t read_ = 0;  // bytes of head + body read so far
};

}  // namespace

GatedHttpServer::GatedHttpServer(ConnectionGateLimits limits, size_t worker_threads, QuickRequest quick,
                                 size_t quick_threads)
    : quick_(std::move(quick)),
      quick_pool_(std::max<size_t>(quick_threads, 1)),
      gate_(limits, [this](std::shared_ptr<ReceivedRequest> request) {
        // The gate's thread: queue the request for a worker, never block.
        const bool quick_one = quick_ && quick_(request->method, request->target);
        httplib::TaskQueue* pool = quick_one ? &quick_pool_ : pool_.load();
        if (pool == nullptr) {
          close(request->sock);
          return;
        }
        pool->enqueue([this, request] { serve(*request); });
      }) {
  new_task_queue = [this, worker_threads] {
    auto* pool = new httplib::ThreadPool(worker_threads);
    pool_ = pool;
    return pool;
  };
}

GatedHttpServer::~GatedHttpServer() {
  close_gate();
  quick_pool_.shutdown();  // its tasks use the gate: done before members go
}

void GatedHttpServer::close_gate() { gate_.stop(); }

bool GatedHttpServer::process_and_close_socket(socket_t sock) {
  gate_.admit(sock);
  return true;
}

void GatedHttpServer::serve(ReceivedRequest& request) {
  const int sock = request.sock;
  RequestStream stream(sock, request.request, write_timeout_sec_);
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
  request.request = {};  // its bytes leave the gate's budget (request.charge) with the task
  if (answered && !client_closes && is_running()) {
    // Kept alive: the next request (some of it maybe read already) is waited for in the gate, not on this worker.
    gate_.admit(sock, std::move(request.leftover));
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
