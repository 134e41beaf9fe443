#pragma once
// Time stamps as RFC 3339 text in UTC with nanoseconds
// ("2024-07-22T20:33:28.123648000Z"): how Ollama's API writes created_at,
// modified_at and expires_at.
#include <chrono>
#include <string>

namespace kvserve::server {

std::string rfc3339_utc(std::chrono::system_clock::time_point time);

}  // namespace kvserve::server
