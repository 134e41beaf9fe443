#include "server/keep_alive.h"

#include <cmath>
#include <cstdlib>
#include <string_view>

#include "server/api_error.h"

namespace kvserve::server {
namespace {

// Milliseconds per unit of a Go duration; 0: not a unit.
double unit_millis(std::string_view unit) {
  if (unit == "ns") return 1e-6;
  if (unit == "us" || unit == "µs" || unit == "μs") return 1e-3;
  if (unit == "ms") return 1;
  if (unit == "s") return 1e3;
  if (unit == "m") return 60e3;
  if (unit == "h") return 3600e3;
  return 0;
}

bool is_number_char(char c) { return (c >= '0' && c <= '9') || c == '.'; }

// A decimal number ("1", "1.5", ".5", "2."): nullopt when the text is not one.
std::optional<double> decimal(std::string_view text) {
  if (text.empty() || text == "." || text.size() > 32) return std::nullopt;
  if (text.find('.') != text.rfind('.')) return std::nullopt;
  const std::string copy(text);  // strtod wants a terminated string
  char* end = nullptr;
  const double v = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

KeepAlive of_millis(double millis, bool negative) {
  if (negative && millis > 0) return kKeepForever;
  if (millis >= static_cast<double>(kKeepAliveMax.count())) return kKeepForever;
  return KeepAlive(static_cast<int64_t>(std::llround(millis)));
}

}  // namespace

KeepAlive keep_alive_of_seconds(double seconds) {
  if (!std::isfinite(seconds)) return kKeepForever;
  return of_millis(std::fabs(seconds) * 1e3, seconds < 0);
}

std::optional<KeepAlive> parse_keep_alive(const std::string& text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  std::string_view rest(text);
  const bool negative = rest.front() == '-';
  if (rest.front() == '-' || rest.front() == '+') rest.remove_prefix(1);
  if (rest.empty()) return std::nullopt;
  if (std::optional<double> seconds = decimal(rest)) return of_millis(*seconds * 1e3, negative);  // seconds
  double millis = 0;
  while (!rest.empty()) {
    size_t digits = 0;
    while (digits < rest.size() && is_number_char(rest[digits])) ++digits;
    size_t unit_end = digits;
    while (unit_end < rest.size() && !is_number_char(rest[unit_end])) ++unit_end;
    const std::optional<double> value = decimal(rest.substr(0, digits));
    const double unit = unit_millis(rest.substr(digits, unit_end - digits));
    if (!value || unit == 0) return std::nullopt;
    millis += *value * unit;
    rest.remove_prefix(unit_end);
  }
  return of_millis(millis, negative);
}

std::optional<KeepAlive> keep_alive_field(const nlohmann::json& body) {
  const auto it = body.is_object() ? body.find("keep_alive") : body.end();
  if (!body.is_object() || it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number()) return keep_alive_of_seconds(it->get<double>());
  std::optional<KeepAlive> parsed = it->is_string() ? parse_keep_alive(it->get<std::string>()) : std::nullopt;
  if (!parsed)
    throw invalid("keep_alive", "keep_alive must be a number of seconds or a duration such as \"5m\" or \"1h30m\"");
  return parsed;
}

std::string keep_alive_text(KeepAlive keep_alive) {
  const int64_t ms = keep_alive.count();
  if (ms < 0) return "forever";
  if (ms % 3600000 == 0 && ms > 0) return std::to_string(ms / 3600000) + "h";
  if (ms % 60000 == 0 && ms > 0) return std::to_string(ms / 60000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace kvserve::server
