// Kernel benchmark: memory read bandwidth, then matmul throughput per weight
// type, shape, token count and kernel path, printed as markdown tables.
//   ./build/microbench_kernels [--decode-only] [--no-bandwidth] [--wide] [TYPE...]
//   ./build/microbench_kernels --tokens [TYPE...]
// OMP_NUM_THREADS sets the matmul threads; TYPE (q4_1, f16, ...) limits the
// types; --decode-only skips the 64-token runs; --wide uses 1536-column
// shapes (Qwen2.5-1.5B's width), which K-quants always get (rows of 256).
// --tokens: matmul time for n_tokens = 1..9 (speculative verification passes)
// on the layer shapes of SmolLM2-135M and Qwen2.5-1.5B, both activation
// precisions, 1 and 2 threads, with t(n) / t(1).
// Numbers are best-of-N wall times; the machine may be shared, so rerun when
// a number looks off.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"
#include "kernels/read_bandwidth.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Best time of `fn` over repetitions that fill about `budget_s` (at least one,
// after one untimed warm-up call when a call is short).
template <typename Fn>
double best_time(Fn&& fn, double budget_s = 0.3) {
  const auto first = Clock::now();
  fn();
  double best = seconds_since(first);
  if (best > budget_s) return best;
  const auto start = Clock::now();
  for (int rep = 0; rep < 1000 && seconds_since(start) < budget_s; ++rep) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

struct Shape {
  const char* label;
  int64_t rows, cols;
  bool cold;  // cycle through copies bigger than the last-level cache
};

// Fast reproducible noise in [-1, 1) (xorshift64*), so that filling hundreds
// of MiB stays quick.
struct Noise {
  uint64_t state;
  float next() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const uint64_t bits = state * 0x2545f4914f6cdd1dull;
    return static_cast<float>(bits >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
};

// Enough copies of a random matrix that cycling through them streams from
// DRAM rather than the 32 MiB L3. Every copy holds different values: memory
// deduplication (in the VM or on its host) could otherwise back identical
// copies with the same physical pages, which would then sit in cache.
struct BenchMatrix {
  std::vector<AlignedBuffer<uint8_t>> copies;
  size_t bytes = 0;
};

BenchMatrix make_matrix(DType type, const Shape& s) {
  BenchMatrix m;
  const size_t row_bytes = dtype_row_bytes(type, s.cols);
  m.bytes = row_bytes * static_cast<size_t>(s.rows);
  constexpr size_t kColdBytes = 128u << 20;  // 4x the 32 MiB L3
  const size_t n_copies = s.cold ? std::max<size_t>(1, (kColdBytes + m.bytes - 1) / m.bytes) : 1;
  std::vector<float> row(static_cast<size_t>(s.cols));
  for (size_t c = 0; c < n_copies; ++c) {
    Noise noise{0x9e3779b97f4a7c15ull * (c + 1)};
    AlignedBuffer<uint8_t> copy(m.bytes);
    for (int64_t r = 0; r < s.rows; ++r) {
      for (float& v : row) v = noise.next();
      quantize_row(type, row.data(), copy.data() + static_cast<size_t>(r) * row_bytes, s.cols);
    }
    m.copies.push_back(std::move(copy));
  }
  return m;
}

TensorView view_of(DType type, const Shape& s, const uint8_t* data, size_t bytes) {
  TensorView w;
  w.name = "bench";
  w.type = type;
  w.n_dims = 2;
  w.ne = {s.cols, s.rows, 1, 1};
  w.data = data;
  w.nbytes = bytes;
  return w;
}

// The machine may be shared: every configuration is timed in a few rounds,
// interleaved, and keeps its best time, so a burst of outside load spoils at
// most one round of it.
constexpr int kRounds = 3;

struct Config {
  int64_t n_tokens;
  Isa isa;
  double best_s;
};

void bench_type(DType type, const Shape& shape, double bandwidth, bool decode_only) {
  BenchMatrix m = make_matrix(type, shape);
  std::vector<Config> configs;
  for (int64_t n_tokens : {1, 64})
    if (!decode_only || n_tokens == 1)
      for (Isa isa : available_isas()) configs.push_back({n_tokens, isa, 1e30});
  for (int round = 0; round < kRounds; ++round) {
    for (Config& c : configs) {
      if (round > 0 && c.best_s > 0.1) continue;  // slow enough that load spikes matter little
      AlignedBuffer<float> x(static_cast<size_t>(c.n_tokens * shape.cols));  // 64-byte aligned, as the model's
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f;
      std::vector<float> y(static_cast<size_t>(c.n_tokens * shape.rows));
      set_kernel_isa(c.isa);
      size_t next = 0;
      c.best_s = std::min(c.best_s, best_time(
                                        [&] {
                                          const AlignedBuffer<uint8_t>& w = m.copies[next++ % m.copies.size()];
                                          matmul(view_of(type, shape, w.data(), m.bytes), x.data(), c.n_tokens, y.data());
                                        },
                                        0.1));
    }
  }
  for (const Config& c : configs) {
    const double gbs = static_cast<double>(m.bytes) / c.best_s / 1e9;
    const double gflops = 2.0 * static_cast<double>(shape.rows * shape.cols * c.n_tokens) / c.best_s / 1e9;
    std::printf("| %s | %s | %lld | %s | %.3f | %.1f | %.1f | %.0f%% |\n", dtype_name(type), shape.label,
                static_cast<long long>(c.n_tokens), isa_name(c.isa), c.best_s * 1e3, gbs, gflops, 100.0 * gbs / bandwidth);
  }
  std::fflush(stdout);
}

// The --tokens bench's kernel path: KVSERVE_ISA where set (e.g. avx2 on an
// AVX-512 machine), else the best one.
Isa tokens_bench_isa() { return std::getenv("KVSERVE_ISA") ? active_isa() : best_isa(); }

// Matmul time for n_tokens = 1..kMaxTokens on one cold shape: every n and
// both activation precisions interleaved over kRounds rounds, best kept.
void bench_tokens(DType type, const Shape& shape, int threads) {
  constexpr int64_t kMaxTokens = 9;
  BenchMatrix m = make_matrix(type, shape);
  const ActivationPrecision precisions[] = {ActivationPrecision::kF32, ActivationPrecision::kQ8};
  double best[2][kMaxTokens + 1];
  for (auto& row : best) std::fill(std::begin(row), std::end(row), 1e30);
  AlignedBuffer<float> x(static_cast<size_t>(kMaxTokens * shape.cols));
  Noise noise{7};
  for (size_t i = 0; i < x.size(); ++i) x[i] = noise.next();
  std::vector<float> y(static_cast<size_t>(kMaxTokens * shape.rows));
  set_kernel_isa(tokens_bench_isa());
  omp_set_num_threads(threads);
  for (int round = 0; round < kRounds; ++round)
    for (int p = 0; p < 2; ++p) {
      set_activation_precision(precisions[p]);
      for (int64_t n = 1; n <= kMaxTokens; ++n) {
        size_t next = 0;
        best[p][n] = std::min(best[p][n], best_time(
                                              [&] {
                                                const AlignedBuffer<uint8_t>& w = m.copies[next++ % m.copies.size()];
                                                matmul(view_of(type, shape, w.data(), m.bytes), x.data(), n, y.data());
                                              },
                                              0.05));
      }
    }
  set_activation_precision(ActivationPrecision::kF32);
  for (int p = 0; p < 2; ++p) {
    std::printf("| %s | %s | %s | %d |", dtype_name(type), shape.label, activation_precision_name(precisions[p]),
                threads);
    for (int64_t n = 1; n <= kMaxTokens; ++n) std::printf(" %.3f |", best[p][n] * 1e3);
    std::printf(" %.1f |", static_cast<double>(m.bytes) / best[p][1] / 1e9);
    for (int64_t n : {2, 3, 5, 9}) std::printf(" %.2f |", best[p][n] / best[p][1]);
    std::printf("\n");
    std::fflush(stdout);
  }
}

void run_tokens_bench(const std::vector<DType>& only) {
  struct Case {
    DType type;
    Shape shape;
  };
  // SmolLM2-135M (dim 576, FFN 1536, Q4_1) and Qwen2.5-1.5B (dim 1536, FFN
  // 8960, Q4_K with Q6_K ffn_down), plus the other block types on SmolLM2's FFN shape.
  const Case cases[] = {
      {DType::Q4_1, {"1536x576 (cold)", 1536, 576, true}},   {DType::Q4_1, {"576x1536 (cold)", 576, 1536, true}},
      {DType::Q4_0, {"1536x576 (cold)", 1536, 576, true}},   {DType::Q8_0, {"1536x576 (cold)", 1536, 576, true}},
      {DType::Q5_0, {"1536x576 (cold)", 1536, 576, true}},   {DType::Q4_K, {"8960x1536 (cold)", 8960, 1536, true}},
      {DType::Q4_K, {"1536x1536 (cold)", 1536, 1536, true}}, {DType::Q6_K, {"1536x8960 (cold)", 1536, 8960, true}},
  };
  std::printf("## matmul ms vs n_tokens (%s, best of %d interleaved rounds)\n\n", isa_name(tokens_bench_isa()), kRounds);
  std::printf("| type | shape (rows x cols) | activations | threads |");
  for (int n = 1; n <= 9; ++n) std::printf(" n=%d |", n);
  std::printf(" n=1 GB/s | t2/t1 | t3/t1 | t5/t1 | t9/t1 |\n|---|---|---|---|");
  for (int n = 1; n <= 14; ++n) std::printf("---:|");
  std::printf("\n");
  for (const Case& c : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.type) == only.end()) continue;
    for (int threads : {1, 2}) bench_tokens(c.type, c.shape, threads);
  }
}

}  // namespace
}  // namespace kvserve

struct Options {
  bool decode_only = false;
  bool bandwidth = true;
  bool wide = false;
  bool tokens = false;
  std::vector<kvserve::DType> types;
};

Options parse_options(int argc, char** argv) {
  using namespace kvserve;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--decode-only") {
      o.decode_only = true;
    } else if (arg == "--no-bandwidth") {
      o.bandwidth = false;
    } else if (arg == "--wide") {
      o.wide = true;
    } else if (arg == "--tokens") {
      o.tokens = true;
    } else {
      o.types.push_back(parse_dtype(arg));
    }
  }
  if (o.types.empty() && !o.tokens) o.types = {DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::F16, DType::BF16, DType::F32};
  return o;
}

double print_bandwidth(const kvserve::AlignedBuffer<uint8_t>& buf, int threads) {
  using namespace kvserve;
  std::printf("## Read bandwidth (1 GiB buffer in 64 MiB slices, best slice of several passes)\n\n| threads | GB/s |\n|---|---|\n");
  double best[2] = {0, 0};
  for (int round = 0; round < kRounds; ++round)
    for (int t : {1, 2}) best[t - 1] = std::max(best[t - 1], read_bandwidth_gbps(buf.data(), buf.size(), t));
  for (int t : {1, 2}) std::printf("| %d | %.1f |\n", t, best[t - 1]);
  return best[std::min(threads, 2) - 1];
}

// Decode efficiency with the bandwidth measured right before each matmul, so
// that outside memory traffic (the machine is shared) hits both alike; the
// median round is the summary.
void print_paired_decode(const kvserve::AlignedBuffer<uint8_t>& buf, int max_threads) {
  using namespace kvserve;
  const Shape shape = {"49152x576 (cold)", 49152, 576, true};
  std::printf("\n## Decode vs read bandwidth measured just before (%s, one token, cold 49152x576)\n\n",
              isa_name(best_isa()));
  std::printf("| threads | round | read GB/s | q4_1 GB/s | q4_1 %% | q8_0 GB/s | q8_0 %% |\n|---|---|---|---|---|---|---|\n");
  BenchMatrix q4_1 = make_matrix(DType::Q4_1, shape), q8_0 = make_matrix(DType::Q8_0, shape);
  set_kernel_isa(best_isa());
  AlignedBuffer<float> x(static_cast<size_t>(shape.cols)), y(static_cast<size_t>(shape.rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f;
  const auto decode_gbs = [&](DType type, const BenchMatrix& m) {
    size_t next = 0;
    const double t = best_time(
        [&] {
          const AlignedBuffer<uint8_t>& w = m.copies[next++ % m.copies.size()];
          matmul(view_of(type, shape, w.data(), m.bytes), x.data(), 1, y.data());
        },
        0.2);
    return static_cast<double>(m.bytes) / t / 1e9;
  };
  constexpr int kPairedRounds = 7;
  for (int threads = 1; threads <= std::min(max_threads, 2); ++threads) {
    omp_set_num_threads(threads);
    std::vector<double> q4_1_ratio, q8_0_ratio;
    for (int round = 1; round <= kPairedRounds; ++round) {
      const double read = read_bandwidth_gbps(buf.data(), buf.size(), threads);
      const double a = decode_gbs(DType::Q4_1, q4_1), b = decode_gbs(DType::Q8_0, q8_0);
      q4_1_ratio.push_back(a / read);
      q8_0_ratio.push_back(b / read);
      std::printf("| %d | %d | %.1f | %.1f | %.0f%% | %.1f | %.0f%% |\n", threads, round, read, a, 100 * a / read, b,
                  100 * b / read);
      std::fflush(stdout);
    }
    std::sort(q4_1_ratio.begin(), q4_1_ratio.end());
    std::sort(q8_0_ratio.begin(), q8_0_ratio.end());
    std::printf("| %d | median | | | %.0f%% | | %.0f%% |\n", threads, 100 * q4_1_ratio[kPairedRounds / 2],
                100 * q8_0_ratio[kPairedRounds / 2]);
  }
  omp_set_num_threads(max_threads);
}

int run(int argc, char** argv) {
  using namespace kvserve;
  const Options options = parse_options(argc, argv);
  if (options.tokens) {
    run_tokens_bench(options.types);
    return 0;
  }
  const int threads = omp_get_max_threads();
  AlignedBuffer<uint8_t> buf(options.bandwidth ? size_t{1} << 30 : 0);
  Noise noise{42};
  for (size_t i = 0; i < buf.size(); i += 64) buf[i] = static_cast<uint8_t>(noise.next() * 127);  // distinct pages
  const double bandwidth = options.bandwidth ? print_bandwidth(buf, threads) : 0.0;
  std::printf("\n## matmul, %d thread(s); %% = weight GB/s over the best %d-thread read bandwidth\n\n", threads,
              std::min(threads, 2));
  std::printf("| type | shape (rows x cols) | tokens | isa | ms | weight GB/s | GFLOP/s | %% of BW |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const Shape narrow[] = {{"49152x576 (cold)", 49152, 576, true}, {"1536x576 (hot)", 1536, 576, false}};
  const Shape wide[] = {{"8960x1536 (cold)", 8960, 1536, true}, {"1536x1536 (hot)", 1536, 1536, false}};
  for (DType type : options.types) {
    const bool use_wide = options.wide || 576 % dtype_info(type).block_size != 0;
    for (const Shape& s : use_wide ? wide : narrow) bench_type(type, s, bandwidth, options.decode_only);
  }
  if (options.bandwidth) print_paired_decode(buf, threads);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kvserve::Error& e) {
    std::fprintf(stderr, "microbench_kernels: %s\n", e.what());
    return 1;
  }
}
