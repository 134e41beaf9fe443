#pragma once
// Raw-socket clients for the server tests that play a hostile or careless
// client (slow, malformed, vanishing), a greedy streamed completion to check
// that others are served meanwhile, and the process's resident memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "server_harness.h"

namespace kvserve::raw_http {

// A connected loopback socket to `port`, or -1.
inline int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

inline bool send_all(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Everything the server sends until it closes the connection or `limit` passes.
inline std::string read_until_closed(int fd, std::chrono::milliseconds limit) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// This process's resident memory (VmRSS), in KiB.
inline int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  return 0;
}

// A greedy streamed completion's text ("" when it failed).
inline std::string greedy_stream(const test_util::TestServer& server, const std::string& prompt, int max_tokens) {
  using json = nlohmann::json;
  std::string received;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    received.append(data, n);
    return true;
  };
  auto r = server.client().send(req);
  if (!r || r->status != 200 || received.find("data: [DONE]") == std::string::npos) return "";
  std::string text;
  for (size_t at = received.find("data: {"); at != std::string::npos; at = received.find("data: {", at + 1)) {
    const json event = json::parse(received.substr(at + 6, received.find('\n', at) - at - 6), nullptr, false);
    if (!event.is_discarded() && !event["choices"].empty()) text += event["choices"][0]["text"].get<std::string>();
  }
  return text;
}

}  // namespace kvserve::raw_http
