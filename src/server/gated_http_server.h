#pragma once
// httplib's server with a ConnectionGate in front of its workers: a worker
// gets a request only once the gate has read it whole, reads it from memory,
// and a kept-alive connection goes back to the gate between requests (so
// neither slow nor idle clients hold workers). Quick requests (say /health)
// have workers of their own, so they never wait behind streaming responses.
// Also knows each request's socket, which httplib 0.11 does not tell
// handlers (ClientConnection needs it).
#include <httplib.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "server/connection_gate.h"

namespace kvserve::server {

class GatedHttpServer : public httplib::Server {
 public:
  // Whether a request (method, target) is quick: answered at once, without
  // waiting on anything; those are served by quick_threads of their own.
  using QuickRequest = std::function<bool(const std::string& method, const std::string& target)>;
  GatedHttpServer(ConnectionGateLimits limits, size_t worker_threads, QuickRequest quick = {}, size_t quick_threads = 4);
  ~GatedHttpServer() override;

  // Closes the waiting connections and admits no more; call before stop().
  void close_gate();
  // The socket of the connection `req` came on, while its handler runs; -1
  // when unknown.
  int socket_of(const httplib::Request& req) const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  void serve(ReceivedRequest& request);  // one request, on a worker

  std::atomic<httplib::TaskQueue*> pool_{nullptr};  // created by listen(), alive until it returns
  QuickRequest quick_;
  httplib::ThreadPool quick_pool_;
  ConnectionGate gate_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int> live_;  // (peer host, peer port) -> socket, while served
};

}  // namespace kvserve::server
