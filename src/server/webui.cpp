#include "server/webui.h"

#include <httplib.h>

#include <algorithm>
#include <string>

namespace kvserve::server {
namespace {

// Scripts, styles and requests from the page's own origin only: no inline
// script (the page's JavaScript is /webui.js), so that model text that ever
// became markup could not run. frame-ancestors: no other site may frame it.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

void write_asset(const WebAsset& asset, httplib::Response& res) {
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-cache");  // a new binary's page is used at once
  res.set_content(std::string(asset.body), std::string(asset.content_type));
}

// httplib matches a route as a regular expression: the dot in "/webui.js" must match only a dot.
std::string route_pattern(std::string_view path) {
  std::string pattern;
  for (char c : path) {
    if (c == '.') pattern += '\\';
    pattern += c;
  }
  return pattern;
}

}  // namespace

bool is_webui_path(std::string_view path) {
  const std::span<const WebAsset> assets = webui_assets();
  return std::any_of(assets.begin(), assets.end(), [&](const WebAsset& a) { return a.path == path; });
}

void install_webui_routes(httplib::Server& server) {
  for (const WebAsset& asset : webui_assets())
    server.Get(route_pattern(asset.path), [&asset](const httplib::Request&, httplib::Response& res) { write_asset(asset, res); });
}

}  // namespace kvserve::server
