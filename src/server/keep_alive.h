#pragma once
// Ollama's keep_alive: how long a model stays loaded after its last request
// (docs/server.md, "Many models"). A number of seconds, or a Go duration
// ("5m", "1h30m", "300ms", "1.5h", "-1s"); negative: forever; 0: unloaded as
// soon as its requests end.
#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace kvserve::server {

// Negative: forever. Durations longer than kKeepAliveMax are forever too.
using KeepAlive = std::chrono::milliseconds;
inline constexpr KeepAlive kKeepForever{-1};
inline constexpr KeepAlive kKeepAliveMax = std::chrono::hours(24 * 365 * 100);

// Go's time.ParseDuration syntax or a plain number of seconds; nullopt for
// anything else (the caller names its field or flag). Never throws.
std::optional<KeepAlive> parse_keep_alive(const std::string& text);
// A JSON number of seconds, as keep_alive_of a double; never throws.
KeepAlive keep_alive_of_seconds(double seconds);
// A request body's "keep_alive" (Ollama's, and kvserve's extension on the OpenAI paths): nullopt when absent or
// null (the server's default applies). Throws ApiError 400 naming keep_alive for anything else.
std::optional<KeepAlive> keep_alive_field(const nlohmann::json& body);
// "5m", "30s", "1h", "250ms", "forever": for messages and logs.
std::string keep_alive_text(KeepAlive keep_alive);

}  // namespace kvserve::server
