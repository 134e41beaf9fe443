// `kvserve bench` default mode, like llama-bench: prompt processing (pp) and
// text generation (tg) speed per model / thread count, mean and standard
// deviation over repetitions, and how close tg runs to the memory-bandwidth
// limit (weight bytes read per token x tokens/s vs the measured bandwidth).
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "apps/cmd_bench.h"
#include "apps/membw.h"
#include "core/error.h"
#include "decode/decoder.h"
#include "model/model.h"

namespace kvserve::cli {
namespace {

struct BenchRow {
  std::string model, type, test;
  double size_mib = 0, params_m = 0;
  int threads = 0;
  double mean = 0, stddev = 0;   // tokens/s
  double gbps = 0, pct_bw = 0;   // tg only: weight bytes/s and share of the measured bandwidth
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int32_t> bench_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  return t;
}

// Tokens/s of one repetition: pp appends n tokens as one prompt; tg decodes n
// tokens one at a time after a one-token prompt (as llama-bench does).
double run_once(const Model& m, bool prompt, int64_t n) {
  const auto tokens = bench_tokens(n + 1, m.config().vocab_size);
  auto d = make_decoder("cached", m, std::min<int64_t>(m.config().context_length, n + 2));
  if (prompt) return static_cast<double>(n) / seconds_of([&] { d->append(std::span(tokens).first(static_cast<size_t>(n))); });
  d->append(std::span(tokens).first(1));
  return static_cast<double>(n) / seconds_of([&] {
    for (int64_t i = 1; i <= n; ++i) d->append(std::span(tokens).subspan(static_cast<size_t>(i), 1));
  });
}

std::string model_type(const Model& m) {
  const TensorView& t = m.weights().layers.at(0).w_gate;
  return dtype_name(t.type);
}

BenchRow measure(const Model& m, bool prompt, int64_t n, int threads, int reps) {
  BenchRow row;
  row.model = m.config().name;
  row.type = model_type(m);
  row.test = (prompt ? "pp" : "tg") + std::to_string(n);
  row.size_mib = static_cast<double>(m.file().file_size()) / 1048576.0;
  for (const TensorView& t : m.file().tensors()) row.params_m += static_cast<double>(t.numel()) / 1e6;
  row.threads = threads;
  run_once(m, prompt, std::min<int64_t>(n, 16));  // warm-up: page in the weights
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) v.push_back(run_once(m, prompt, n));
  row.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - row.mean) * (x - row.mean);
  row.stddev = v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0;
  if (!prompt) row.gbps = static_cast<double>(m.weight_bytes_per_token()) * row.mean / 1e9;
  return row;
}

void print_rows(const std::vector<BenchRow>& rows, const std::string& format, double bw, long peak_rss_kib) {
  if (format == "json") {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const BenchRow& r = rows[i];
      std::printf("  {\"model\": \"%s\", \"type\": \"%s\", \"size_mib\": %.2f, \"params_m\": %.2f, \"threads\": %d, "
                  "\"test\": \"%s\", \"tokens_per_s\": %.3f, \"stddev\": %.3f, \"weight_gb_per_s\": %.3f, "
                  "\"membw_gb_per_s\": %.3f, \"pct_of_bandwidth\": %.1f, \"peak_rss_mib\": %.1f}%s\n",
                  r.model.c_str(), r.type.c_str(), r.size_mib, r.params_m, r.threads, r.test.c_str(), r.mean,
                  r.stddev, r.gbps, bw, r.pct_bw, peak_rss_kib / 1024.0, i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
    return;
  }
  const bool csv = format == "csv";
  std::printf(csv ? "model,type,size_mib,params_m,threads,test,tokens_per_s,stddev,weight_gb_per_s,pct_of_bandwidth\n"
                  : "| model | type | size | params | threads | test | t/s | weights GB/s | %% of %.1f GB/s |\n"
                    "|---|---|---:|---:|---:|---|---:|---:|---:|\n", bw);
  for (const BenchRow& r : rows) {
    if (csv)
      std::printf("%s,%s,%.2f,%.2f,%d,%s,%.2f,%.2f,%.2f,%.1f\n", r.model.c_str(), r.type.c_str(), r.size_mib,
                  r.params_m, r.threads, r.test.c_str(), r.mean, r.stddev, r.gbps, r.pct_bw);
    else if (r.gbps > 0)
      std::printf("| %s | %s | %.1f MiB | %.1f M | %d | %s | %.2f ± %.2f | %.2f | %.0f%% |\n", r.model.c_str(),
                  r.type.c_str(), r.size_mib, r.params_m, r.threads, r.test.c_str(), r.mean, r.stddev, r.gbps, r.pct_bw);
    else
      std::printf("| %s | %s | %.1f MiB | %.1f M | %d | %s | %.2f ± %.2f | | |\n", r.model.c_str(), r.type.c_str(),
                  r.size_mib, r.params_m, r.threads, r.test.c_str(), r.mean, r.stddev);
  }
  if (!csv) std::printf("\npeak RSS: %.1f MiB\n", peak_rss_kib / 1024.0);
}

}  // namespace

int run_llama_bench(const BenchOptions& o) {
  if (o.repetitions < 1) throw Error("--repetitions must be >= 1, got " + std::to_string(o.repetitions));
  const int all = omp_get_max_threads();
  if (o.membw) {
    for (int t = 1; t <= all; ++t) std::printf("memory read bandwidth, %d thread%s: %.1f GB/s\n", t, t > 1 ? "s" : "", measure_read_bandwidth_gbps(t));
    return 0;
  }
  std::vector<BenchRow> rows;
  for (const std::string& path : o.models) {
    auto m = Model::load(path);
    for (int t : o.threads) {
      if (t < 0) throw Error("--threads must be >= 0, got " + std::to_string(t));
      omp_set_num_threads(t == 0 ? all : t);
      for (int64_t n : o.n_prompt)
        if (n > 0) rows.push_back(measure(*m, true, n, t == 0 ? all : t, o.repetitions));
      for (int64_t n : o.n_gen)
        if (n > 0) rows.push_back(measure(*m, false, n, t == 0 ? all : t, o.repetitions));
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);  // before the bandwidth probe's 1 GiB buffer
  const double bw = measure_read_bandwidth_gbps(all);
  for (BenchRow& r : rows) r.pct_bw = r.gbps > 0 ? 100.0 * r.gbps / bw : 0;
  print_rows(rows, o.output, bw, ru.ru_maxrss);
  return 0;
}

}  // namespace kvserve::cli
