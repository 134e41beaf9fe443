#pragma once
// Per-request timings of a serving benchmark and the report made from them,
// shared by the in-process engine run and the remote (HTTP) run.
//
// TTFT is measured from the request's arrival in the workload (so time spent
// waiting for a slot counts), TPOT is (last token - first token) / (tokens - 1),
// ITL is the gap between successive deliveries of tokens (an engine event or
// an SSE chunk, usually one token).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace kvserve::loadgen {

struct RequestTiming {
  double arrival_s = 0;              // all times in seconds since the run's start
  double first_token_s = -1;         // -1: no token arrived
  double finish_s = 0;
  int64_t output_tokens = 0;
  std::vector<double> itl_s;         // gaps between successive deliveries after the first

  // Records a delivery of `tokens` tokens (>= 1) at time `now_s`.
  void add_delivery(double now_s, int64_t tokens);

 private:
  double last_delivery_s_ = -1;
};

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
};
Stats stats_of(std::vector<double> values);

struct ServingSummary {
  int64_t requests = 0;
  int64_t output_tokens = 0;
  double duration_s = 0;             // start of the run to the last finish
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  Stats ttft_ms, tpot_ms, itl_ms;
};
ServingSummary summarize(const std::vector<RequestTiming>& timings);

// A Markdown table: the common columns (throughput, TTFT, TPOT, ITL) and the
// extra columns a runner adds (engine counters, for instance).
class ReportTable {
 public:
  explicit ReportTable(std::vector<std::string> extra_headers = {});
  void print_header(std::FILE* out) const;
  // `extra` holds one value per extra header.
  void print_row(std::FILE* out, const std::string& name, const ServingSummary& s,
                 const std::vector<std::string>& extra = {}) const;

 private:
  std::vector<std::string> extra_headers_;
};

}  // namespace kvserve::loadgen
