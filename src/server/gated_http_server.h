#pragma once
// httplib's server with a ConnectionGate in front of its workers: a worker
// takes a connection only once its request has arrived, and a kept-alive
// connection goes back to the gate between requests (so neither slow nor idle
// clients hold workers). Also knows each request's socket, which httplib 0.11
// does not tell handlers (ClientConnection needs it).
#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "server/connection_gate.h"

namespace kvserve::server {

class GatedHttpServer : public httplib::Server {
 public:
  GatedHttpServer(ConnectionGateLimits limits, size_t worker_threads);
  ~GatedHttpServer() override;

  // Closes the waiting connections and admits no more; call before stop().
  void close_gate();
  // The socket of the connection `req` came on, while its handler runs; -1
  // when unknown.
  int socket_of(const httplib::Request& req) const;
  size_t waiting_connections() const { return gate_.held(); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  void serve(int sock);  // one request, on a worker

  std::atomic<httplib::TaskQueue*> pool_{nullptr};  // created by listen(), alive until it returns
  ConnectionGate gate_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int> live_;  // (peer host, peer port) -> socket, while served
};

}  // namespace kvserve::server
