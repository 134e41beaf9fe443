#include "server/client_connection.h"

#include <httplib.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <string>

namespace kvserve::server {
namespace {

// The numeric host and the port of a socket address, as httplib reports them.
bool host_and_port(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::stoi(p);
  return true;
}

bool is_connection(int fd, const httplib::Request& req) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return false;
  std::string local_host, peer_host;
  int local_port = -1, peer_port = -1;
  return host_and_port(local, local_len, local_host, local_port) && local_port == req.local_port &&
         host_and_port(peer, peer_len, peer_host, peer_port) && peer_port == req.remote_port &&
         peer_host == req.remote_addr;
}

int find_socket(const httplib::Request& req) {
  try {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const int fd = std::stoi(name);
      if (is_connection(fd, req)) return fd;
    }
  } catch (const std::filesystem::filesystem_error&) {  // no /proc: not Linux, or not mounted
  }
  return -1;
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& req) : fd_(req.remote_port > 0 ? find_socket(req) : -1) {}

bool ClientConnection::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (!(p.revents & POLLIN)) return false;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);  // 0: the peer's end of stream
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace kvserve::server
