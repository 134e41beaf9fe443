// The 8-bit-activation matmul against its ceiling:
//   ./build/microbench_gemm [--peak-only] [--smollm2] [TYPE...]
// 1. The int8 dot-product peak of this CPU (what a prefill GEMM could reach):
//    independent chains of AVX2 maddubs + add (u8 x s8 -> s16, 32 multiply-adds
//    per instruction) and, where present, AVX-512 VNNI vpdpbusd (256 and 512
//    bits), per thread and on all threads. GOP/s counts a multiply-add as 2.
// 2. Each type's q8 matmul on model-shaped matrices for n = 1..512 tokens:
//    the kernels over the original GGUF rows vs over the repacked rows
//    (kernels/repack.h), interleaved in one run, best of several calls.
//    Float types (f32 f16 bf16, f32 activations): the old row kernels vs the
//    float GEMM over repacked rows (kernels/float_packed.h), on SmolLM2 shapes,
//    against the f32 FMA peak.
//    --smollm2: SmolLM2-135M's shapes (1536x576, 576x1536) for the quantized
//    types instead of Qwen2.5-Coder-1.5B's.
// 3. --decode-stream TYPE...: one-token matmuls over 320 MiB of repacked
//    copies (far past the last-level cache, as in decode), GB/s of weights
//    against the read-bandwidth probe measured just before and after.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/float_packed.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"
#include "kernels/read_bandwidth.h"
#include "kernels/repack.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

template <typename Fn>
double best_time(Fn&& fn, double budget_s) {
  const auto first = Clock::now();
  fn();
  double best = seconds_since(first);
  const auto start = Clock::now();
  for (int rep = 0; rep < 200 && seconds_since(start) < budget_s; ++rep) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// ---- Peak ------------------------------------------------------------------------

constexpr int64_t kPeakIters = 1 << 22;

// 8 chains of maddubs + add_epi16: 8 x 32 multiply-adds per iteration.
__attribute__((target("avx2"))) int64_t maddubs_chains(int64_t iters) {
  __m256i acc[8];
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (auto& v : acc) v = _mm256_setzero_si256();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm256_add_epi16(v, _mm256_maddubs_epi16(a, _mm256_xor_si256(b, v)));
  __m256i sum = acc[0];
  for (int k = 1; k < 8; ++k) sum = _mm256_add_epi16(sum, acc[k]);
  return _mm256_extract_epi16(sum, 0);
}

__attribute__((target("avx512f,avx512vl,avx512vnni"))) int64_t dpbusd256_chains(int64_t iters) {
  __m256i acc[8];
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (auto& v : acc) v = _mm256_setzero_si256();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm256_dpbusd_epi32(v, a, b);
  __m256i sum = acc[0];
  for (int k = 1; k < 8; ++k) sum = _mm256_add_epi32(sum, acc[k]);
  return _mm256_extract_epi32(sum, 0);
}

__attribute__((target("avx512f,avx512vnni"))) int64_t dpbusd512_chains(int64_t iters) {
  __m512i acc[8];
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (auto& v : acc) v = _mm512_setzero_si512();
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm512_dpbusd_epi32(v, a, b);
  __m512i sum = acc[0];
  for (int k = 1; k < 8; ++k) sum = _mm512_add_epi32(sum, acc[k]);
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, sum);
  return lanes[0];
}

// 8 chains of 256-bit f32 FMA: 8 x 8 multiply-adds per iteration (the
// float GEMM's ceiling, kernels/float_packed.h).
__attribute__((target("avx2,fma"))) int64_t fma_chains(int64_t iters) {
  __m256 acc[8];
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (auto& v : acc) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 8
    for (auto& v : acc) v = _mm256_fmadd_ps(v, a, b);
  }
  __m256 sum = acc[0];
  for (int k = 1; k < 8; ++k) sum = _mm256_add_ps(sum, acc[k]);
  return static_cast<int64_t>(_mm256_cvtss_f32(sum));
}

// GOP/s of `chains` (8 chains x macs_per_op multiply-adds per iteration) on `threads` threads.
double peak_gops(int64_t (*chains)(int64_t), int macs_per_op, int threads) {
  double best = 1e30;
  volatile int64_t sink = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads)
    { sink = sink + chains(kPeakIters); }
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * 8.0 * macs_per_op * static_cast<double>(kPeakIters) * threads / best / 1e9;
}

void print_peak() {
  const CpuFeatures& f = cpu_features();
  const int threads = omp_get_max_threads();
  std::printf("## int8 dot-product peak (GOP/s, 1 multiply-add = 2 ops)\n\n| instruction | 1 thread | %d threads |\n|---|---:|---:|\n", threads);
  if (f.avx2)
    std::printf("| AVX2 vpmaddubsw + vpaddw (256-bit) | %.0f | %.0f |\n", peak_gops(maddubs_chains, 32, 1),
                peak_gops(maddubs_chains, 32, threads));
  if (f.avx2 && f.fma)
    std::printf("| AVX2 vfmadd f32 (256-bit; GFLOP/s) | %.0f | %.0f |\n", peak_gops(fma_chains, 8, 1),
                peak_gops(fma_chains, 8, threads));
  if (f.avx512f && f.avx512vl && f.avx512vnni) {
    std::printf("| AVX-512 VNNI vpdpbusd (256-bit) | %.0f | %.0f |\n", peak_gops(dpbusd256_chains, 32, 1),
                peak_gops(dpbusd256_chains, 32, threads));
    std::printf("| AVX-512 VNNI vpdpbusd (512-bit) | %.0f | %.0f |\n", peak_gops(dpbusd512_chains, 64, 1),
                peak_gops(dpbusd512_chains, 64, threads));
  }
  std::printf("\n");
}

// ---- Matmul ------------------------------------------------------------------------

struct Shape {
  const char* label;
  int64_t rows, cols;
};

TensorView random_matrix(DType type, const Shape& s, AlignedBuffer<uint8_t>& bytes) {
  bytes.resize(dtype_row_bytes(type, s.cols) * static_cast<size_t>(s.rows));
  std::vector<float> row(static_cast<size_t>(s.cols));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (float& v : row) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
    }
    quantize_row(type, row.data(), bytes.data() + static_cast<size_t>(r) * dtype_row_bytes(type, s.cols), s.cols);
  }
  TensorView w;
  w.name = "bench";
  w.type = type;
  w.n_dims = 2;
  w.ne = {s.cols, s.rows, 1, 1};
  w.data = bytes.data();
  w.nbytes = bytes.size();
  return w;
}

void bench_type(DType type, const Shape& s) {
  AlignedBuffer<uint8_t> bytes, packed;
  const TensorView plain = random_matrix(type, s, bytes);
  const bool is_float = float_weight_type(type);
  packed.resize(is_float ? float_packed_matrix_bytes(type, s.rows, s.cols) : packed_matrix_bytes(type, s.rows, s.cols));
  const auto t0 = Clock::now();
  if (is_float) repack_float_rows8(plain, packed.data());
  else repack_rows8(plain, packed.data());
  const double repack_ms = seconds_since(t0) * 1e3;
  TensorView repacked = plain;
  repacked.packed = packed.data();
  for (int64_t n : {1, 4, 16, 64, 256, 512}) {
    AlignedBuffer<float> x(static_cast<size_t>(n * s.cols));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 29) * 0.1f - 1.4f;
    std::vector<float> y(static_cast<size_t>(n * s.rows));
    double best[2] = {1e30, 1e30};
    for (int round = 0; round < 3; ++round)
      for (int k = 0; k < 2; ++k) {
        const TensorView& w = k == 0 ? plain : repacked;
        best[k] = std::min(best[k], best_time([&] { matmul(w, x.data(), n, y.data()); }, n >= 64 ? 0.3 : 0.1));
      }
    const double ops = 2.0 * static_cast<double>(s.rows * s.cols * n);
    std::printf("| %s | %s | %lld | %.3f | %.3f | %.0f | %.0f | %.2fx | %.0f |\n", dtype_name(type), s.label,
                static_cast<long long>(n), best[0] * 1e3, best[1] * 1e3, ops / best[0] / 1e9, ops / best[1] / 1e9,
                best[0] / best[1], repack_ms);
    std::fflush(stdout);
  }
}

// Decode's view of a kernel: one token against matrices that come from DRAM.
void bench_decode_stream(DType type) {
  const Shape s{"8960x1536", 8960, 1536};
  AlignedBuffer<uint8_t> bytes;
  const TensorView plain = random_matrix(type, s, bytes);
  const size_t one = packed_matrix_bytes(type, s.rows, s.cols);
  const size_t copies = std::max<size_t>(8, (size_t{320} << 20) / one);
  AlignedBuffer<uint8_t> packed(one * copies);
  repack_rows8(plain, packed.data());
  for (size_t c = 1; c < copies; ++c) std::copy_n(packed.data(), one, packed.data() + c * one);
  std::vector<float> x(static_cast<size_t>(s.cols)), y(static_cast<size_t>(s.rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 29) * 0.1f - 1.4f;
  const int threads = omp_get_max_threads();
  const double probe_before = read_bandwidth_gbps(packed.data(), packed.size(), threads);
  const double best = best_time([&] {
    for (size_t c = 0; c < copies; ++c) {
      TensorView w = plain;
      w.packed = packed.data() + c * one;
      matmul(w, x.data(), 1, y.data());
    }
  }, 2.0);
  const double probe_after = read_bandwidth_gbps(packed.data(), packed.size(), threads);
  const double gbps = static_cast<double>(one * copies) / best / 1e9;
  std::printf("| %s | %zu x %s | %.1f | %.1f / %.1f | %.0f%% |\n", dtype_name(type), copies, s.label, gbps,
              probe_before, probe_after, 100.0 * gbps / std::max(probe_before, probe_after));
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  bool peak_only = false, decode_stream = false, smollm2 = false;
  std::vector<DType> types;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--peak-only") peak_only = true;
    else if (arg == "--decode-stream") decode_stream = true;
    else if (arg == "--smollm2") smollm2 = true;
    else types.push_back(parse_dtype(arg));
  }
  if (types.empty()) types = {DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q4_K, DType::Q6_K};
  std::printf("kernel table: %s, %d threads\n\n", isa_name(active_isa()), omp_get_max_threads());
  if (decode_stream) {
    set_activation_precision(ActivationPrecision::kQ8);
    std::printf("## one token over repacked weights from memory\n\n");
    std::printf("| type | matrices | weights GB/s | probe GB/s before / after | of the better probe |\n|---|---|---:|---:|---:|\n");
    for (DType type : types)
      if (packable_type(type)) bench_decode_stream(type);
    return 0;
  }
  print_peak();
  if (peak_only) return 0;
  set_activation_precision(ActivationPrecision::kQ8);
  std::printf("## matmul: original rows vs repacked rows (ms, GOP/s; q8 activations, f32 for float weights)\n\n");
  std::printf("| type | shape | tokens | original ms | repacked ms | original GOP/s | repacked GOP/s | speedup | repack ms |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  const Shape qwen_shapes[] = {{"1536x1536", 1536, 1536}, {"8960x1536", 8960, 1536}, {"1536x8960", 1536, 8960}};
  const Shape smollm2_shapes[] = {{"1536x576", 1536, 576}, {"576x1536", 576, 1536}};
  const auto shapes = smollm2 ? std::span<const Shape>(smollm2_shapes) : std::span<const Shape>(qwen_shapes);
  // Float weights on SmolLM2's shapes (its f16 / bf16 copies are the float models measured).
  const Shape float_shapes[] = {{"1536x576", 1536, 576}, {"576x1536", 576, 1536}, {"576x576", 576, 576}};
  for (DType type : types)
    for (const Shape& s : float_weight_type(type) ? std::span<const Shape>(float_shapes) : std::span<const Shape>(shapes))
      if (s.cols % dtype_info(type).block_size == 0) bench_type(type, s);
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  try {
    return kvserve::run(argc, argv);
  } catch (const kvserve::Error& e) {
    std::fprintf(stderr, "microbench_gemm: %s\n", e.what());
    return 1;
  }
}
