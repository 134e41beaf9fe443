#include "loadgen/serving_stats.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve::loadgen {
namespace {

std::string three(const Stats& s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f / %.1f / %.1f", s.mean, s.p50, s.p99);
  return buf;
}

}  // namespace

void RequestTiming::add_delivery(double now_s, int64_t tokens) {
  if (first_token_s < 0) first_token_s = now_s;
  else itl_s.push_back(now_s - last_delivery_s_);
  last_delivery_s_ = now_s;
  output_tokens += tokens;
}

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  s.p50 = at(0.50);
  s.p99 = at(0.99);
  return s;
}

ServingSummary summarize(const std::vector<RequestTiming>& timings) {
  ServingSummary s;
  std::vector<double> ttft, tpot, itl;
  for (const RequestTiming& t : timings) {
    s.requests++;
    s.output_tokens += t.output_tokens;
    s.duration_s = std::max(s.duration_s, t.finish_s);
    if (t.first_token_s >= 0) ttft.push_back((t.first_token_s - t.arrival_s) * 1e3);
    if (t.output_tokens > 1)
      tpot.push_back((t.finish_s - t.first_token_s) * 1e3 / static_cast<double>(t.output_tokens - 1));
    for (double gap : t.itl_s) itl.push_back(gap * 1e3);
  }
  if (s.duration_s > 0) {
    s.requests_per_s = static_cast<double>(s.requests) / s.duration_s;
    s.output_tokens_per_s = static_cast<double>(s.output_tokens) / s.duration_s;
  }
  s.ttft_ms = stats_of(std::move(ttft));
  s.tpot_ms = stats_of(std::move(tpot));
  s.itl_ms = stats_of(std::move(itl));
  return s;
}

ReportTable::ReportTable(std::vector<std::string> extra_headers) : extra_headers_(std::move(extra_headers)) {}

void ReportTable::print_header(std::FILE* out) const {
  std::fprintf(out, "| %-19s | %7s | %9s | %-27s | %-24s | %-22s |", "schedule", "req/s", "out tok/s",
               "TTFT ms mean / p50 / p99", "TPOT ms mean / p50 / p99", "ITL ms mean / p50 / p99");
  for (const std::string& h : extra_headers_) std::fprintf(out, " %7s |", h.c_str());
  std::fprintf(out, "\n|---------------------|--------:|----------:|-----------------------------|--------------------------|"
                    "------------------------|");
  for (size_t i = 0; i < extra_headers_.size(); ++i) std::fprintf(out, "--------:|");
  std::fprintf(out, "\n");
  std::fflush(out);
}

void ReportTable::print_row(std::FILE* out, const std::string& name, const ServingSummary& s,
                            const std::vector<std::string>& extra) const {
  check(extra.size() == extra_headers_.size(), "ReportTable::print_row: one extra value per extra header");
  std::fprintf(out, "| %-19s | %7.2f | %9.1f | %-27s | %-24s | %-22s |", name.c_str(), s.requests_per_s,
               s.output_tokens_per_s, three(s.ttft_ms).c_str(), three(s.tpot_ms).c_str(), three(s.itl_ms).c_str());
  for (const std::string& v : extra) std::fprintf(out, " %7s |", v.c_str());
  std::fprintf(out, "\n");
  std::fflush(out);
}

}  // namespace kvserve::loadgen
