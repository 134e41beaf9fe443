#pragma once
// The waiting room in front of the HTTP workers. httplib 0.11 gives every
// accepted connection a worker thread that blocks reading it, so a client that
// sends its request one byte per second, or thousands that send nothing, hold
// every worker and starve everyone else. Connections wait here instead, in
// one epoll loop, until their whole request head (and a small body) is in the
// kernel's buffer; only then does a worker take them. Whoever is not done by
// the deadline gets 408, an over-long head 431, an announced body past the
// limit 413, and past `max_held` the
// longest-waiting connection is closed to make room; one that sends nothing
// is closed after idle_timeout (docs/reliability.md).
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kvserve::server {

struct ConnectionGateLimits {
  std::chrono::milliseconds request_deadline{30000};  // from admission to a complete head + body, else 408
  std::chrono::milliseconds idle_timeout{10000};      // a connection that sends nothing is closed (silently)
  size_t max_head_bytes = 16384;                      // request line + headers
  // A body up to this is waited for here; a larger one is read by the worker
  // (bounded by its per-read timeout and the server's body limit).
  size_t max_peek_bytes = 32768;
  size_t max_body_bytes = 16 << 20;  // a larger Content-Length is refused with 413 before any body is read
  size_t max_held = 4096;            // connections waiting at once
};

// What a peek at a connection's pending bytes shows.
enum class RequestHead {
  kIncomplete,  // keep waiting
  kReady,       // head (and body up to max_peek_bytes) arrived: hand it to a worker
  kTooLong,     // no end of head within max_head_bytes
  kBodyTooLarge,  // the head announces a body past max_body_bytes
};
// Classifies the bytes received so far (exposed for tests).
RequestHead classify_request_bytes(std::string_view bytes, const ConnectionGateLimits& limits);

class ConnectionGate {
 public:
  // ready(sock) runs on the gate's thread and must not block (it queues the
  // socket for a worker); it takes ownership of the socket.
  ConnectionGate(ConnectionGateLimits limits, std::function<void(int)> ready);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Takes ownership of an accepted socket; safe from any thread. After stop()
  // the socket is closed at once.
  void admit(int sock);
  // Closes every waiting connection and ends the thread; idempotent.
  void stop();
  size_t held() const;

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  void take_admitted();
  void hold(int sock);
  void check(int sock, bool hung_up);
  void expire(Clock::time_point now);
  void release(int sock);  // stops watching sock (does not close it)
  void refuse(int sock, int status, const std::string& message);

  ConnectionGateLimits limits_;
  std::function<void(int)> ready_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: admit() and stop() wake the loop
  mutable std::mutex mutex_;
  std::vector<int> admitted_;  // guarded by mutex_
  bool stopping_ = false;      // guarded by mutex_
  struct Held {
    Clock::time_point since;
    bool got_bytes = false;
  };
  std::unordered_map<int, Held> held_;  // the gate thread's only
  size_t held_count_ = 0;                            // guarded by mutex_ (for held())
  std::vector<char> peek_buffer_;
  std::thread thread_;
};

}  // namespace kvserve::server
