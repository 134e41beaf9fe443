#pragma once
// Whether the client of a request being handled has hung up, for handlers
// that write nothing until the end (non-streaming generation) and so would
// otherwise not notice. httplib 0.11 gives handlers no access to their socket
// (later versions have Request::is_connection_closed); GatedHttpServer knows
// it (socket_of).
namespace kvserve::server {

class ClientConnection {
 public:
  // sock: the request's connection, valid while its handler runs; -1 when
  // unknown (then closed() is always false).
  explicit ClientConnection(int sock) : fd_(sock) {}

  // True once the client has closed (or half-closed) or reset the connection.
  // Reads nothing from the socket (peeks); costs one poll() call.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace kvserve::server
