// Attention benchmark: time per call and bytes touched, flash vs the
// materializing reference, for decode (1 query row after N cached tokens) and
// chunked prefill (the last 256 rows of an N-token context, the way the
// decoder prefills in chunks), with the K/V cache in each storage type.
//   ./build/microbench_attention [--min-n 512] [--max-n 16384] [--no-reference] [--decode-only] [--type f16]
//                                [--shape 9,3,64] [--layers 1] [--q8-query-parts 2]
// Shape: SmolLM2-135M's attention (9 query heads, 3 K/V heads, head size 64),
// one layer, or --shape H,KV,D (Qwen2.5-0.5B: 14,2,64; 1.5B: 12,2,128; Gemma 3
// 270M: 4,1,256); --layers L times a call over L layers' caches in turn (a
// model's decode step: SmolLM2 has 30). --q8-query-parts 1 scores q8_0 keys with
// the one-part query that rotated caches use (AttentionShape::q8_query_parts).
// OMP_NUM_THREADS sets the threads. Best-of-N wall times.
// "MB touched" counts distinct bytes: the K/V cache in its storage type, plus
// for the reference its score matrix (written, then read back).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/kv_type.h"
#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/key_lanes.h"
#include "kernels/kv_quant.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kPrefillRows = 256;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <typename Fn>
double best_time(Fn&& fn, double budget_s = 0.25) {
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

struct Inputs {
  int64_t n;
  std::vector<float> q, k, v, out;
};

Inputs make_inputs(int64_t n, const AttentionShape& shape) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t kv_width = shape.n_kv_heads * shape.head_dim, q_width = shape.n_heads * shape.head_dim;
  Inputs in{n, std::vector<float>(static_cast<size_t>(kPrefillRows * q_width)),
            std::vector<float>(static_cast<size_t>(n * kv_width)), std::vector<float>(static_cast<size_t>(n * kv_width)),
            std::vector<float>(static_cast<size_t>(kPrefillRows * q_width))};
  for (auto* vec : {&in.q, &in.k, &in.v})
    for (float& x : *vec) x = dist(rng);
  return in;
}

// K and V of one layer stored as `type`, contiguous and head-major, as the
// caches store them (f16 / bf16 K in lanes, kernels/key_lanes.h), in the
// pool's kind of buffer (huge pages where the kernel gives them).
struct TypedCache {
  AlignedBuffer<uint8_t> k, v;
  const uint8_t *k_base, *v_base;
  KVRows k_rows, v_rows;
  TypedCache(KVType type, const Inputs& in, const AttentionShape& shape) {
    const int64_t hd = shape.head_dim, heads = shape.n_kv_heads;
    const size_t head_bytes = kv_head_bytes(type, hd), head_stride = static_cast<size_t>(in.n) * head_bytes;
    const bool lanes = stores_keys_in_lanes(type, in.n, false);
    k.resize(static_cast<size_t>(heads) * head_stride);
    v.resize(static_cast<size_t>(heads) * head_stride);
    for (int64_t p = 0; p < in.n; ++p) {
      const float* kp = in.k.data() + p * heads * hd;
      const size_t at = static_cast<size_t>(p) * head_bytes, group = static_cast<size_t>(p - p % kKeyLanes) * head_bytes;
      if (lanes) quantize_kv_token_lanes(type, heads, hd, kp, k.data() + group, head_stride, p % kKeyLanes);
      else quantize_kv_token(type, heads, hd, kp, k.data() + at, head_stride);
      quantize_kv_token(type, heads, hd, in.v.data() + p * heads * hd, v.data() + at, head_stride);
    }
    k_base = k.data();
    v_base = v.data();
    k_rows = {type, in.n, head_bytes, &k_base, head_stride, lanes};
    v_rows = {type, in.n, head_bytes, &v_base, head_stride};
  }
  double kv_bytes() const { return static_cast<double>(k.size() + v.size()); }
};

void print_row(const char* mode, int64_t n, const char* kernel, const char* type, double seconds, double bytes,
               double ref_seconds) {
  char speedup[32] = "";
  if (ref_seconds > 0) std::snprintf(speedup, sizeof speedup, "%.1fx", ref_seconds / seconds);
  std::printf("| %s | %lld | %s | %s | %.3f | %.1f | %.2f | %s |\n", mode, static_cast<long long>(n), kernel, type,
              seconds * 1e3, bytes / 1e6, bytes / seconds / 1e9, speedup);
}

// Every storage type, or only `only` (profiling one kernel).
// A call covers `layers` layers, each with its own copy of the cache (as a
// model's decode step reads one layer's K/V after another, none in cache).
void bench_context(int64_t n, const AttentionShape& shape, int layers, bool with_reference, bool decode_only,
                   std::optional<KVType> only) {
  Inputs in = make_inputs(n, shape);
  const int64_t kv_width = shape.n_kv_heads * shape.head_dim;
  const double f32_kv_bytes = 2.0 * static_cast<double>(n * kv_width) * 4;
  for (const auto& [mode, rows] : {std::pair<const char*, int64_t>{"decode", 1}, {"prefill", kPrefillRows}}) {
    if (decode_only && rows > 1) continue;
    const int64_t n_q = std::min(rows, n), pos0 = n - n_q;
    double ref_s = 0;
    if (with_reference) {
      ref_s = best_time([&] {
        for (int l = 0; l < layers; ++l)
          attention_reference(in.q.data(), n_q, pos0, in.k.data(), in.v.data(), n, kv_width, shape, in.out.data());
      });
      // Distinct bytes: the K/V cache plus the score matrix, written and read back.
      const double score_bytes = 2.0 * static_cast<double>(n_q * n * shape.n_heads) * 4;
      print_row(mode, n, "reference", "f32", ref_s, layers * (f32_kv_bytes + score_bytes), 0);
    }
    for (KVType type : {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0}) {
      if (only && type != *only) continue;
      std::vector<std::unique_ptr<const TypedCache>> caches;  // TypedCache points into itself: never moved
      for (int l = 0; l < layers; ++l) caches.push_back(std::make_unique<const TypedCache>(type, in, shape));
      const double s = best_time([&] {
        for (const auto& cache : caches)
          flash_attention(in.q.data(), n_q, pos0, cache->k_rows, cache->v_rows, n, shape, in.out.data());
      });
      print_row(mode, n, "flash", kv_type_info(type).name, s, layers * caches[0]->kv_bytes(),
                type == KVType::F32 ? ref_s : 0);
    }
  }
}

}  // namespace
}  // namespace kvserve

// "H,KV,D" with KV dividing H: the shape's three counts.
static bool parse_shape(const char* text, kvserve::AttentionShape& shape) {
  long long h = 0, kv = 0, d = 0;
  if (std::sscanf(text, "%lld,%lld,%lld", &h, &kv, &d) != 3 || h < 1 || kv < 1 || d < 1 || h % kv != 0) return false;
  shape = kvserve::AttentionShape{h, kv, d};
  return true;
}

int main(int argc, char** argv) {
  int64_t min_n = 512, max_n = 16384;
  bool with_reference = true, decode_only = false;
  std::optional<kvserve::KVType> only;
  kvserve::AttentionShape shape{9, 3, 64};
  int layers = 1, q8_parts = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-n") == 0 && i + 1 < argc) max_n = std::atoll(argv[++i]);
    else if (std::strcmp(argv[i], "--min-n") == 0 && i + 1 < argc) min_n = std::max<int64_t>(1, std::atoll(argv[++i]));
    else if (std::strcmp(argv[i], "--type") == 0 && i + 1 < argc) only = kvserve::parse_kv_type(argv[++i], "--type");
    else if (std::strcmp(argv[i], "--no-reference") == 0) with_reference = false;
    else if (std::strcmp(argv[i], "--decode-only") == 0) decode_only = true;
    else if (std::strcmp(argv[i], "--layers") == 0 && i + 1 < argc) layers = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc && parse_shape(argv[++i], shape)) continue;
    else if (std::strcmp(argv[i], "--q8-query-parts") == 0 && i + 1 < argc) q8_parts = std::atoi(argv[++i]) == 1 ? 1 : 2;
    else {
      std::fprintf(stderr, "usage: microbench_attention [--min-n N] [--max-n N] [--no-reference] [--decode-only] [--type T]\n"
                           "                            [--shape H,KV,D (query heads, K/V heads, head size)] [--layers L]\n"
                           "                            [--q8-query-parts 1|2]\n");
      return 2;
    }
  }
  shape.q8_query_parts = q8_parts;
  std::printf("threads: %d, shape: %lld query heads, %lld K/V heads, head size %lld, %d layer(s) per call; prefill = last %lld rows\n\n",
              omp_get_max_threads(), static_cast<long long>(shape.n_heads), static_cast<long long>(shape.n_kv_heads),
              static_cast<long long>(shape.head_dim), layers, static_cast<long long>(kvserve::kPrefillRows));
  std::printf("| mode | N | kernel | KV type | ms/call | MB touched | GB/s | speedup vs reference |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int64_t n = min_n; n <= max_n; n *= 2) kvserve::bench_context(n, shape, layers, with_reference, decode_only, only);
  return 0;
}
