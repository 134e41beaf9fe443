// libFuzzer target: the benchmark client's --url parser. Only kvserve::Error
// may come out, and an accepted URL has a host, a port in 1..65535 and an
// API base ending in /v1.
#include <cstdlib>
#include <string>

#include "loadgen/http_url.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvserve::loadgen::HttpUrl url =
        kvserve::loadgen::parse_http_url(std::string(reinterpret_cast<const char*>(data), size));
    const bool sane = !url.host.empty() && url.port >= 1 && url.port <= 65535 && url.api_base.ends_with("/v1");
    if (!sane) std::abort();
  } catch (const kvserve::Error&) {
  }
  return 0;
}
