#pragma once
// Cross-origin requests from browser pages (a chat page or an editor plugin
// served from another origin): which origins may call the API, the headers
// their answers carry, and the answers to preflight (OPTIONS) requests.
// Off by default: a browser then keeps every answer from other origins' pages.
#include <string>
#include <string_view>
#include <vector>

#include <httplib.h>

namespace kvserve::server {

class CorsPolicy {
 public:
  // `origins`: "scheme://host[:port]" each, or "*" for any. Throws
  // kvserve::Error naming an entry that is neither.
  explicit CorsPolicy(std::vector<std::string> origins = {});

  bool enabled() const { return !origins_.empty(); }
  // Whether a page of `origin` (a request's Origin header) may read the answers.
  bool allows(std::string_view origin) const;
  // Adds the CORS headers to the answer of a request from an allowed origin.
  void add_headers(const httplib::Request& req, httplib::Response& res) const;
  // A preflight (OPTIONS with Access-Control-Request-Method): answers it
  // whole (204 with what may be sent, or 403 for an origin not allowed) and
  // returns true; false for any other request.
  bool answer_preflight(const httplib::Request& req, httplib::Response& res) const;

 private:
  std::vector<std::string> origins_;
  bool any_ = false;
};

}  // namespace kvserve::server
