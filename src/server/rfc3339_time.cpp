#include "server/rfc3339_time.h"

#include <cstdio>
#include <ctime>

namespace kvserve::server {

std::string rfc3339_utc(std::chrono::system_clock::time_point time) {
  using namespace std::chrono;
  const auto since_epoch = time.time_since_epoch();
  const auto whole_seconds = floor<seconds>(since_epoch);
  const auto nanos = duration_cast<nanoseconds>(since_epoch - whole_seconds).count();
  const std::time_t t = whole_seconds.count();
  std::tm tm{};
  gmtime_r(&t, &tm);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[64];
  std::snprintf(out, sizeof out, "%s.%09lldZ", date, static_cast<long long>(nanos));
  return out;
}

}  // namespace kvserve::server
