#pragma once
// The base URL of an OpenAI-compatible server, as given to --url:
// "http://host[:port][/prefix]". The API lives under prefix + "/v1" unless the
// prefix already ends with "/v1" ("http://127.0.0.1:8080" and
// "http://127.0.0.1:8080/v1" name the same API).
#include <string>

namespace kvserve::loadgen {

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string api_base;  // "/v1", "/openai/v1", ...

  std::string origin() const { return "http://" + host + ":" + std::to_string(port); }
  std::string endpoint(const std::string& path) const { return origin() + api_base + path; }
};

// Throws kvserve::Error naming what is wrong (no scheme, https, a bad port).
HttpUrl parse_http_url(const std::string& url);

}  // namespace kvserve::loadgen
