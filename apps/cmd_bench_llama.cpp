// `kvserve bench` default mode, like llama-bench: prompt processing (pp) and
// text generation (tg) speed per model / thread count, mean and standard
// deviation over repetitions, and how close tg runs to the memory-bandwidth
// limit (weight bytes read per token x tokens/s vs the measured bandwidth),
// and the K/V bytes decode attention reads per second spent in it.
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
#include "core/kv_type.h"
#include "decode/decoder.h"
#include "kv/kv_shape.h"
#include "model/model.h"

namespace kvserve::cli {
namespace {

struct BenchRow {
  std::string model, type, test;
  double size_mib = 0, params_m = 0;
  int threads = 0;
  double mean = 0, stddev = 0;   // tokens/s
  double gbps = 0, pct_bw = 0;   // tg only: weight bytes/s and share of the measured bandwidth
  double kv_gbps = 0;            // tg only: K and V bytes attention read per second of the whole step
  double attention_kv_gbps = 0;  // tg only: the same bytes per second spent in the attention kernels
  double pct_attention_bw = 0;   // tg only: attention_kv_gbps as a share of the measured bandwidth
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

// One llama-bench test: pp appends n tokens as one prompt, tg decodes n
// tokens one at a time; both after `depth` tokens of context (llama-bench's
// -d; its prefill is not timed).
struct BenchTest {
  bool prompt = true;
  int64_t n = 0;
  int64_t depth = 0;
  std::string name() const {
    return (prompt ? "pp" : "tg") + std::to_string(n) + (depth > 0 ? " @ d" + std::to_string(depth) : "");
  }
};

// A decoder holding `depth` tokens of context, prefilled in chunks of 512 (as llama-bench's batches).
std::unique_ptr<Decoder> decoder_at_depth(const Model& m, KVType kv, const BenchTest& t, std::span<const int32_t> tokens) {
  // tg from depth 0 decodes after a one-token prompt; pp needs exactly depth + n (pp8192 on an 8K model).
  const int64_t context = t.depth + t.n + (!t.prompt && t.depth == 0 ? 1 : 0);
  if (context > m.config().context_length)
    throw Error(t.name() + " needs " + std::to_string(context) + " tokens of context; " + m.config().name + " has " +
                std::to_string(m.config().context_length));
  // Each repetition rolls back t.n tokens: a sliding layers' ring must hold them too.
  auto d = make_decoder("cached", m, context, kv, std::max<int64_t>(512, t.n));
  for (int64_t at = 0; at < t.depth; at += 512)
    d->append(tokens.subspan(static_cast<size_t>(at), static_cast<size_t>(std::min<int64_t>(512, t.depth - at))));
  return d;
}

// Tokens/s of one repetition of n tokens, the decoder rolled back to the depth first;
// adds the timed tokens' seconds in attention to *attention_s.
double run_once(Decoder& d, const BenchTest& t, std::span<const int32_t> tokens, int64_t n, double* attention_s) {
  d.truncate(t.depth);
  const auto at = static_cast<size_t>(t.depth);
  if (t.prompt) return static_cast<double>(n) / seconds_of([&] { d.append(tokens.subspan(at, static_cast<size_t>(n))); });
  size_t next = at;
  if (t.depth == 0) d.append(tokens.subspan(next++, 1));  // a one-token prompt first, as llama-bench does
  const double attention_before = d.attention_seconds();
  const double tokens_per_s = static_cast<double>(n) / seconds_of([&] {
    for (int64_t i = 0; i < n; ++i) d.append(tokens.subspan(next++, 1));
  });
  *attention_s += d.attention_seconds() - attention_before;
  return tokens_per_s;
}

// K and V bytes attention reads per decoded token, averaged over a tg test's positions
// (MLA: the latent rows once, V being a view of them).
double kv_bytes_per_token(const Model& m, KVType kv, const BenchTest& t) {
  const KVShape shape = m.config().kv_shape();
  const double row = (shape.values_in_keys() ? 1.0 : 2.0) * static_cast<double>(shape.n_kv_heads * kv_vector_bytes(kv, shape.head_dim));
  const double mean_position = static_cast<double>(t.depth) + static_cast<double>(t.n) / 2.0;
  double positions = 0;
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    const bool sliding = shape.sliding_window > 0 && shape.layer_is_sliding[static_cast<size_t>(l)];
    positions += sliding ? std::min(mean_position, static_cast<double>(shape.sliding_window)) : mean_position;
  }
  return row * positions;
}

std::string model_type(const Model& m) {
  const LayerWeights& l = m.weights().layers.at(0);
  const TensorView& t = l.experts.empty() ? l.w_gate : l.experts[0].gate;
  return dtype_name(t.type);
}

BenchRow measure(const Model& m, KVType kv, const BenchTest& t, int threads, int reps) {
  BenchRow row;
  row.model = m.config().name;
  row.type = model_type(m);
  row.test = t.name();
  row.size_mib = static_cast<double>(m.file().file_size()) / 1048576.0;
  for (const TensorView& tensor : m.file().tensors()) row.params_m += static_cast<double>(tensor.numel()) / 1e6;
  row.threads = threads;
  const auto tokens = bench_tokens(t.depth + t.n + 1, m.config().vocab_size);
  auto d = decoder_at_depth(m, kv, t, tokens);
  double warm_up_attention_s = 0, attention_s = 0;
  run_once(*d, t, tokens, std::min<int64_t>(t.n, 16), &warm_up_attention_s);  // warm-up: page in the weights
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) v.push_back(run_once(*d, t, tokens, t.n, &attention_s));
  row.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - row.mean) * (x - row.mean);
  row.stddev = v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0;
  if (!t.prompt) {
    row.gbps = static_cast<double>(m.weight_bytes_per_token()) * row.mean / 1e9;
    const double kv_bytes = kv_bytes_per_token(m, kv, t), timed_tokens = static_cast<double>(t.n) * reps;
    row.kv_gbps = kv_bytes * row.mean / 1e9;
    if (attention_s > 0) row.attention_kv_gbps = kv_bytes * timed_tokens / attention_s / 1e9;
  }
  return row;
}

void print_rows(const std::vector<BenchRow>& rows, const std::string& format, double bw, long peak_rss_kib) {
  if (format == "json") {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const BenchRow& r = rows[i];
      std::printf("  {\"model\": \"%s\", \"type\": \"%s\", \"size_mib\": %.2f, \"params_m\": %.2f, \"threads\": %d, "
                  "\"test\": \"%s\", \"tokens_per_s\": %.3f, \"stddev\": %.3f, \"weight_gb_per_s\": %.3f, "
                  "\"kv_gb_per_s\": %.3f, \"attention_kv_gb_per_s\": %.3f, \"membw_gb_per_s\": %.3f, \"pct_of_bandwidth\": %.1f, "
                  "\"attention_pct_of_bandwidth\": %.1f, \"peak_rss_mib\": %.1f}%s\n",
                  r.model.c_str(), r.type.c_str(), r.size_mib, r.params_m, r.threads, r.test.c_str(), r.mean,
                  r.stddev, r.gbps, r.kv_gbps, r.attention_kv_gbps, bw, r.pct_bw, r.pct_attention_bw,
                  peak_rss_kib / 1024.0, i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
    return;
  }
  const bool csv = format == "csv";
  std::printf(csv ? "model,type,size_mib,params_m,threads,test,tokens_per_s,stddev,weight_gb_per_s,kv_gb_per_s,"
                    "pct_of_bandwidth,attention_kv_gb_per_s,attention_pct_of_bandwidth\n"
                  : "| model | type | size | params | threads | test | t/s | weights GB/s | KV GB/s | %% of %.1f GB/s "
                    "| attention's KV GB/s (%% of it) |\n|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|\n", bw);
  for (const BenchRow& r : rows) {
    if (csv)
      std::printf("%s,%s,%.2f,%.2f,%d,%s,%.2f,%.2f,%.2f,%.2f,%.1f,%.2f,%.1f\n", r.model.c_str(), r.type.c_str(),
                  r.size_mib, r.params_m, r.threads, r.test.c_str(), r.mean, r.stddev, r.gbps, r.kv_gbps, r.pct_bw,
                  r.attention_kv_gbps, r.pct_attention_bw);
    else if (r.gbps > 0)
      std::printf("| %s | %s | %.1f MiB | %.1f M | %d | %s | %.2f ± %.2f | %.2f | %.2f | %.0f%% | %.2f (%.0f%%) |\n",
                  r.model.c_str(), r.type.c_str(), r.size_mib, r.params_m, r.threads, r.test.c_str(), r.mean,
                  r.stddev, r.gbps, r.kv_gbps, r.pct_bw, r.attention_kv_gbps, r.pct_attention_bw);
    else
      std::printf("| %s | %s | %.1f MiB | %.1f M | %d | %s | %.2f ± %.2f | | | | |\n", r.model.c_str(), r.type.c_str(),
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
  const KVType kv = parse_kv_type(o.kv_type, "--kv-type");
  std::vector<BenchRow> rows;
  for (const std::string& path : o.models) {
    auto m = Model::load(path);
    for (int t : o.threads) {
      if (t < 0) throw Error("--threads must be >= 0, got " + std::to_string(t));
      omp_set_num_threads(t == 0 ? all : t);
      for (int64_t depth : o.n_depth) {
        if (depth < 0) throw Error("--n-depth must be >= 0, got " + std::to_string(depth));
        for (int64_t n : o.n_prompt)
          if (n > 0) rows.push_back(measure(*m, kv, {true, n, depth}, t == 0 ? all : t, o.repetitions));
        for (int64_t n : o.n_gen)
          if (n > 0) rows.push_back(measure(*m, kv, {false, n, depth}, t == 0 ? all : t, o.repetitions));
      }
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);  // before the bandwidth probe's 1 GiB buffer
  const double bw = measure_read_bandwidth_gbps(all);
  for (BenchRow& r : rows) {
    r.pct_bw = r.gbps > 0 ? 100.0 * (r.gbps + r.kv_gbps) / bw : 0;
    r.pct_attention_bw = 100.0 * r.attention_kv_gbps / bw;
  }
  print_rows(rows, o.output, bw, ru.ru_maxrss);
  return 0;
}

}  // namespace kvserve::cli
