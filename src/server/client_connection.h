#pragma once
// Whether the client of a request being handled has hung up, for handlers
// that write nothing until the end (non-streaming generation) and so would
// otherwise not notice. httplib 0.11 gives handlers no access to their socket
// (later versions have Request::is_connection_closed), so it is found once by
// the connection's addresses: the descriptor of this process whose peer is
// remote_addr:remote_port and whose local port is local_port.
//
// Linux only (/proc/self/fd); elsewhere the socket is not found and closed()
// is always false. Valid while the request's handler runs.
namespace httplib {
struct Request;
}

namespace kvserve::server {

class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);

  // True once the client has closed (or half-closed) or reset the connection.
  // Reads nothing from the socket (peeks); costs one poll() call.
  bool closed() const;

 private:
  int fd_ = -1;  // the connection's socket; -1 when not found
};

}  // namespace kvserve::server
