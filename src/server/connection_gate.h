#pragma once
// The front door of the HTTP server. httplib 0.11 gives every connection a
// worker thread that blocks reading it, with no bound on a header line and no
// budget or deadline for a chunked or unsized body, so neither slow nor
// hostile clients may meet a worker. Connections wait here instead, in one
// epoll loop that READS each request into a per-connection buffer under
// every limit (HttpRequestReader) and hands a worker the complete, canonical
// request in memory: a worker never waits on a client's bytes. Refusals:
// malformed 400, over-long head 431, body past the limit 413, not done by
// the deadline 408, past the global buffer budget 503; a connection that
// sends nothing is closed after idle_timeout (docs/reliability.md).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/http_request_reader.h"

namespace kvserve::server {

struct ConnectionGateLimits {
  std::chrono::milliseconds request_deadline{30000};  // from a request's first byte to its last, else 408
  std::chrono::milliseconds idle_timeout{10000};      // a connection that sends nothing is closed (silently)
  size_t max_head_bytes = 16384;                      // request line + headers, else 431
  size_t max_header_line_bytes = 8192;                // one head line, else 431
  size_t max_headers = 100;                           // header lines, else 431
  size_t max_body_bytes = 16 << 20;                   // Content-Length or decoded chunks, else 413
  // Bytes buffered for requests across all connections (announced bodies
  // count in full from their head on), until their worker is done; past it 503.
  // Raised to hold at least one request of max_body_bytes.
  size_t max_buffered_bytes = 256 << 20;
  size_t max_held = 4096;  // connections waiting at once; past it the longest-waiting one gets 503
};

// Bytes counted against the gate's budget; given back when destroyed.
class ByteCharge {
 public:
  ByteCharge() = default;
  ByteCharge(std::shared_ptr<std::atomic<size_t>> used, size_t bytes) : used_(std::move(used)), bytes_(bytes) {}
  ByteCharge(ByteCharge&& other) noexcept : used_(std::move(other.used_)), bytes_(std::exchange(other.bytes_, 0)) {}
  ByteCharge& operator=(ByteCharge&& other) noexcept {
    std::swap(used_, other.used_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~ByteCharge() {
    if (used_) *used_ -= bytes_;
  }

 private:
  std::shared_ptr<std::atomic<size_t>> used_;
  size_t bytes_ = 0;
};

// A whole request, read by the gate, on its way to a worker.
struct ReceivedRequest {
  int sock = -1;
  std::string method, target;
  HttpRequestReader::Request request;  // canonical: CRLF lines, one Content-Length
  std::string leftover;                // bytes received past it (a pipelined next request)
  ByteCharge charge;
};

class ConnectionGate {
 public:
  // ready(request) runs on the gate's thread and must not block (it queues
  // the request for a worker); it takes ownership of the socket.
  ConnectionGate(ConnectionGateLimits limits, std::function<void(std::shared_ptr<ReceivedRequest>)> ready);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Takes ownership of a socket, with the bytes already received on it past
  // its previous request; safe from any thread. After stop() it is closed.
  void admit(int sock, std::string received = {});
  // Closes every waiting connection and ends the thread; idempotent.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Held {
    Clock::time_point since;                      // admitted, or (closing) refused
    std::optional<Clock::time_point> first_byte;  // of the request being read
    HttpRequestReader reader;
    size_t charged = 0;
    bool closing = false;  // refused: draining what the client still sends before closing
  };

  void run();
  void take_admitted();
  void hold(int sock, std::string received);
  void read_from(int sock);
  bool settle(int sock, Held& held);
  void drain(int sock);
  void expire(Clock::time_point now);
  void release(int sock);  // stops watching sock (does not close it)
  void drop(int sock);     // stops watching and closes, silently
  void refuse(int sock, int status, const std::string& message);

  ConnectionGateLimits limits_;
  HttpRequestLimits request_limits_;
  std::function<void(std::shared_ptr<ReceivedRequest>)> ready_;
  std::shared_ptr<std::atomic<size_t>> buffered_ = std::make_shared<std::atomic<size_t>>(0);
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: admit() and stop() wake the loop
  mutable std::mutex mutex_;
  std::vector<std::pair<int, std::string>> admitted_;  // guarded by mutex_
  bool stopping_ = false;                              // guarded by mutex_
  std::unordered_map<int, Held> held_;                 // the gate thread's only
  std::vector<char> read_buffer_;
  std::thread thread_;
};

}  // namespace kvserve::server
