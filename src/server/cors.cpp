#include "server/cors.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve::server {
namespace {

// "scheme://host[:port]": what a browser sends as Origin (no path, no trailing slash).
bool is_origin(std::string_view s) {
  const size_t scheme_end = s.find("://");
  if (scheme_end == std::string_view::npos || scheme_end == 0) return false;
  const std::string_view host = s.substr(scheme_end + 3);
  return !host.empty() && host.find_first_of("/?# ") == std::string_view::npos;
}

}  // namespace

CorsPolicy::CorsPolicy(std::vector<std::string> origins) : origins_(std::move(origins)) {
  for (const std::string& o : origins_) {
    if (o == "*") any_ = true;
    else if (!is_origin(o))
      throw Error("--cors-origins: '" + o + "' is not an origin: give scheme://host[:port] (for example " +
                  "http://localhost:3000) or * for any");
  }
}

bool CorsPolicy::allows(std::string_view origin) const {
  if (origin.empty() || origins_.empty()) return false;
  return any_ || std::find(origins_.begin(), origins_.end(), origin) != origins_.end();
}

void CorsPolicy::add_headers(const httplib::Request& req, httplib::Response& res) const {
  const std::string origin = req.get_header_value("Origin");
  if (!allows(origin)) return;
  // The origin itself rather than "*": answers then also reach pages that send credentials.
  res.set_header("Access-Control-Allow-Origin", origin);
  res.set_header("Vary", "Origin");
  res.set_header("Access-Control-Expose-Headers", "Retry-After");
}

bool CorsPolicy::answer_preflight(const httplib::Request& req, httplib::Response& res) const {
  if (req.method != "OPTIONS" || !req.has_header("Access-Control-Request-Method")) return false;
  if (!allows(req.get_header_value("Origin"))) {
    res.status = 403;
    return true;
  }
  add_headers(req, res);
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");  // DELETE: /v1/responses/{id}
  res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version");
  res.set_header("Access-Control-Max-Age", "600");
  return true;
}

}  // namespace kvserve::server
