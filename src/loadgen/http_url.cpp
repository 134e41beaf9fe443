#include "loadgen/http_url.h"

#include <cctype>

#include "core/error.h"

namespace kvserve::loadgen {
namespace {

int parse_port(const std::string& url, const std::string& text) {
  if (text.empty() || text.size() > 5) throw Error("bad port in URL '" + url + "'");
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) throw Error("bad port in URL '" + url + "'");
  const int port = std::stoi(text);
  if (port < 1 || port > 65535) throw Error("port out of range 1..65535 in URL '" + url + "'");
  return port;
}

}  // namespace

HttpUrl parse_http_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0)
    throw Error("https is not supported (this build's HTTP client has no TLS); use http:// or a local proxy");
  if (url.rfind(scheme, 0) != 0) throw Error("the URL must start with http://, got '" + url + "'");
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();

  HttpUrl out;
  const size_t colon = authority.rfind(':');
  out.host = authority.substr(0, colon);
  if (colon != std::string::npos) out.port = parse_port(url, authority.substr(colon + 1));
  if (out.host.empty()) throw Error("no host in URL '" + url + "'");
  const bool has_v1 = path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0;
  out.api_base = has_v1 ? path : path + "/v1";
  return out;
}

}  // namespace kvserve::loadgen
