#pragma once
// The chat page at / (docs/server.md, "Chat page"): its HTML, JavaScript and
// CSS are compiled into the binary from src/server/webui/ (the build embeds
// them with scripts/embed_webui.cmake) and served with headers that let the
// page load nothing but itself.
#include <span>
#include <string_view>

namespace httplib {
class Server;
}  // namespace httplib

namespace kvserve::server {

struct WebAsset {
  std::string_view path;          // "/", "/webui.js", "/webui_util.js", "/webui.css"
  std::string_view content_type;  // with its charset
  std::string_view body;
};

// The page's files, in the order above (defined in the generated webui_assets.cpp).
std::span<const WebAsset> webui_assets();

// Whether `path` is one of the page's files (they are served without an API key: the page asks for it).
bool is_webui_path(std::string_view path);

// GET routes for each file, answered with the page's security headers.
void install_webui_routes(httplib::Server& server);

}  // namespace kvserve::server
