// KV-cache element types: the e4m3 codec on hand-picked values, the SIMD row
// dequantizers and vector ops against the scalar reference, flash attention
// over typed rows (contiguous and through block tables of awkward sizes)
// against the materializing reference, and decoders with each KV type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "decode/decoder.h"
#include "kernels/attention.h"
#include "kernels/dispatch.h"
#include "kernels/flash_attention.h"
#include "kernels/key_lanes.h"
#include "kernels/kv_quant.h"
#include "kv/contiguous_kv_cache.h"
#include "model/synth.h"
#include "sampling/sampler.h"
#include "isa_util.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

using ::kvserve::test_util::random_vector;
using ::kvserve::test_util::relative_error;

namespace {

constexpr KVType kAllTypes[] = {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0};

// Runs fn once per available kernel ISA (named in failures), restoring the active one after.
template <typename Fn>
void for_each_isa(Fn&& fn) {
  test_util::for_each_isa([&] {
    SCOPED_TRACE(isa_name(active_isa()));
    fn();
  });
}

// K or V rows of n_kv tokens quantized into one contiguous buffer, token-major
// (a token's heads one after the other; the caches store head-major blocks:
// the kernels take either through KVRows' strides).
struct TypedRows {
  KVType type;
  size_t row_bytes, head_bytes;
  std::vector<uint8_t> bytes;
  const uint8_t* base;

  TypedRows(KVType t, const std::vector<float>& values, int64_t n_kv, int64_t n_kv_heads, int64_t head_dim)
      : type(t), row_bytes(static_cast<size_t>(n_kv_heads) * kv_head_bytes(t, head_dim)),
        head_bytes(kv_head_bytes(t, head_dim)),
        bytes(row_bytes * static_cast<size_t>(std::max<int64_t>(n_kv, 1))), base(bytes.data()) {
    for (int64_t p = 0; p < n_kv; ++p)
      for (int64_t h = 0; h < n_kv_heads; ++h)
        quantize_kv_row(t, values.data() + (p * n_kv_heads + h) * head_dim,
                        bytes.data() + static_cast<size_t>(p) * row_bytes + static_cast<size_t>(h) * head_bytes,
                        head_dim);
  }
  KVRows rows(int64_t n_kv) const { return {type, std::max<int64_t>(n_kv, 1), row_bytes, &base, head_bytes}; }
};

// The same rows copied into separately allocated blocks of block_size tokens,
// each token row padded past its size (by 16 bytes: rows must stay aligned for
// their element type, as every real cache keeps them), the table in position order.
struct BlockTableRows {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<const uint8_t*> table;
  KVRows rows;

  BlockTableRows(const TypedRows& src, int64_t n_kv, int64_t block_size) {
    const size_t stride = src.row_bytes + 16;
    const int64_t n_blocks = (n_kv + block_size - 1) / block_size;
    storage.resize(static_cast<size_t>(n_blocks));
    // Allocated last block first so that block addresses do not follow positions.
    for (int64_t b = n_blocks - 1; b >= 0; --b) storage[static_cast<size_t>(b)].assign(stride * block_size, 0xAB);
    for (int64_t p = 0; p < n_kv; ++p)
      std::copy_n(src.bytes.data() + static_cast<size_t>(p) * src.row_bytes, src.row_bytes,
                  storage[static_cast<size_t>(p / block_size)].data() + static_cast<size_t>(p % block_size) * stride);
    for (auto& block : storage) table.push_back(block.data());
    rows = {src.type, block_size, stride, table.data(), src.head_bytes};
  }
};

}  // namespace

TEST(KvQuant, E4m3EncodesHandPickedValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(-2.0f), 0xc0);
  EXPECT_EQ(f32_to_e4m3(0.001953125f), 0x01);          // 2^-9, the smallest subnormal
  EXPECT_EQ(f32_to_e4m3(0.013671875f), 0x07);          // 7 * 2^-9, the largest subnormal
  EXPECT_EQ(f32_to_e4m3(0.015625f), 0x08);             // 2^-6, the smallest normal
  EXPECT_EQ(f32_to_e4m3(0.0009765625f), 0x00);         // 2^-10: halfway to 2^-9, ties to even (0)
  EXPECT_EQ(f32_to_e4m3(0.0029296875f), 0x02);         // 1.5 * 2^-9: ties to even (2)
  EXPECT_EQ(f32_to_e4m3(0.0150f), 0x08);               // a subnormal rounding up into the normals
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);               // between 1 and 1.125: ties to even (1)
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);               // between 1.125 and 1.25: ties to even (1.25)
  EXPECT_EQ(f32_to_e4m3(1.1f), 0x39);
  EXPECT_EQ(f32_to_e4m3(15.5f), 0x58);                 // 15 and 16 tie: 16 (mantissa 0) carries into the exponent
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(460.0f), 0x7e);                // beyond 448 saturates
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(inf), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-inf), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-std::nanf("")), 0xff);
}

TEST(KvQuant, E4m3DecodesEveryCodeAndRoundTrips) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  float previous = -1;
  for (int c = 0; c < 0x7f; ++c) {  // the positive codes are increasing and every value re-encodes to itself
    const float x = e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_GT(x, previous) << c;
    previous = x;
    EXPECT_EQ(f32_to_e4m3(x), c);
    EXPECT_EQ(f32_to_e4m3(-x), c | 0x80);
  }
}

TEST(KvQuant, SimdDequantizeMatchesScalarExactly) {
  std::mt19937 rng(3);
  for (KVType type : kAllTypes)
    for (int64_t n : {8, 24, 32, 72, 96, 160}) {
      if (!kv_type_fits(type, n)) continue;
      auto x = random_vector(static_cast<size_t>(n), rng, 3.0f);
      x[static_cast<size_t>(n / 2)] = 0.0f;
      std::vector<uint8_t> packed(kv_head_bytes(type, n));
      quantize_kv_row(type, x.data(), packed.data(), n);
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), std::nanf(""));
      dequantize_kv_row_scalar(type, packed.data(), want.data(), n);
      for_each_isa([&] {
        dequantize_kv_row(type, packed.data(), got.data(), n);
        EXPECT_EQ(got, want) << kv_type_info(type).name << " n " << n;
      });
    }
}

TEST(KvQuant, Fp8SimdDecodeKeepsNaN) {
  std::vector<float> x(32, 1.0f);
  x[5] = std::nanf("");
  std::vector<uint8_t> packed(kv_head_bytes(KVType::FP8, 32));
  quantize_kv_row(KVType::FP8, x.data(), packed.data(), 32);
  for_each_isa([&] {
    std::vector<float> out(32);
    dequantize_kv_row(KVType::FP8, packed.data(), out.data(), 32);
    EXPECT_TRUE(std::isnan(out[5]));
    EXPECT_EQ(out[4], 1.0f);
  });
}

TEST(KvQuant, RoundTripErrorPerType) {
  // Worst error relative to the row's largest magnitude, per type. fp8: half
  // an e4m3 step in the top binade is 16 against a block maximum of at least
  // 224 after scaling, 7.1%.
  const std::pair<KVType, double> bounds[] = {{KVType::F32, 0},        {KVType::F16, 1e-3},   {KVType::BF16, 4e-3},
                                              {KVType::Q8_0, 4.5e-3},  {KVType::FP8, 7.2e-2}, {KVType::Q4_0, 0.08}};
  std::mt19937 rng(11);
  const int64_t n = 256;
  for (const auto& [type, bound] : bounds) {
    const auto x = random_vector(n, rng, 2.0f);
    std::vector<uint8_t> packed(kv_head_bytes(type, n));
    std::vector<float> y(n);
    quantize_kv_row(type, x.data(), packed.data(), n);
    dequantize_kv_row_scalar(type, packed.data(), y.data(), n);
    EXPECT_LE(relative_error(y, x), bound) << kv_type_info(type).name;
  }
}

TEST(KvQuant, VectorOpsMatchScalar) {
  std::mt19937 rng(5);
  const AttentionVectorOps& ref = scalar_attention_vector_ops();
  for (int64_t n : {1, 7, 8, 16, 17, 63, 64, 100}) {
    const auto a = random_vector(static_cast<size_t>(n), rng, 1.0f), b = random_vector(static_cast<size_t>(n), rng, 1.0f);
    for_each_isa([&] {
      const AttentionVectorOps& ops = attention_vector_ops();
      EXPECT_NEAR(ops.dot(a.data(), b.data(), n), ref.dot(a.data(), b.data(), n), 1e-5 * n) << n;
      auto y0 = b, y1 = b;
      ops.axpy(0.75f, a.data(), y0.data(), n);
      ref.axpy(0.75f, a.data(), y1.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y0[i], y1[i], 1e-6) << n;
      ops.scale(-1.5f, y0.data(), n);
      ref.scale(-1.5f, y1.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y0[i], y1[i], 1e-6) << n;
    });
  }
}

TEST(KvQuant, BlockTypesRejectHeadsThatAreNotWholeBlocks) {
  for (KVType type : {KVType::Q8_0, KVType::FP8, KVType::Q4_0}) {
    EXPECT_THROW(require_kv_type_fits(type, 8), Error);
    EXPECT_THROW(ContiguousKVCache(1, 4, 1, 8, type), Error);
    std::vector<float> q(8), out(8);
    std::vector<uint8_t> row(64);
    const uint8_t* base = row.data();
    const KVRows rows{type, 1, 64, &base, 64};
    EXPECT_THROW(flash_attention(q.data(), 1, 0, rows, rows, 1, {1, 1, 8}, out.data()), Error);
  }
  EXPECT_NO_THROW(ContiguousKVCache(1, 4, 1, 8, KVType::BF16));
}

namespace {

struct AttentionCase {
  int64_t n_kv, n_q, head_dim, n_kv_heads, group;
};

// The query as attention over `type` keys scores it: q8_0 keys are scored
// against each head's query quantized per 32 values in `parts` 8-bit parts
// (key_lanes.h), the others against the query itself.
std::vector<float> query_as_scored(KVType type, const std::vector<float>& q, int64_t head_dim, int parts) {
  if (type != KVType::Q8_0) return q;
  std::vector<float> out(q.size());
  std::vector<int8_t> values(static_cast<size_t>(2 * head_dim));
  std::vector<float> scales(static_cast<size_t>(head_dim / 32));
  std::vector<int32_t> sums(2 * scales.size());
  for (size_t row = 0; row < q.size() / static_cast<size_t>(head_dim); ++row) {
    quantize_query_q8(q.data() + row * head_dim, head_dim, parts, values.data(), scales.data(), sums.data());
    for (int64_t i = 0; i < head_dim; ++i) {
      const double low = parts == 2 ? double(values[head_dim + i]) * kQueryLowStep : 0.0;
      out[row * head_dim + i] = static_cast<float>(scales[i / 32] * (values[i] + low));
    }
  }
  return out;
}

// Flash over typed rows vs the reference over the same rows dequantized (and
// the query as the kernel scores it): both see identical values, so only float
// rounding differs (1e-5 for every type). Against the original f32 K/V and
// query the difference is the storage type's rounding, bounded per type by
// `vs_f32_bound`.
void expect_typed_flash_matches(KVType type, const AttentionCase& c, double vs_f32_bound, int q8_parts = 2) {
  std::mt19937 rng(static_cast<uint32_t>(c.n_kv * 31 + c.head_dim + c.group));
  AttentionShape shape{c.n_kv_heads * c.group, c.n_kv_heads, c.head_dim};
  shape.q8_query_parts = q8_parts;
  const int64_t kv_width = c.n_kv_heads * c.head_dim;
  const auto q = random_vector(static_cast<size_t>(c.n_q * shape.n_heads * c.head_dim), rng, 1.0f);
  const auto k = random_vector(static_cast<size_t>(c.n_kv * kv_width), rng, 1.0f);
  const auto v = random_vector(static_cast<size_t>(c.n_kv * kv_width), rng, 1.0f);
  const TypedRows k_rows(type, k, c.n_kv, c.n_kv_heads, c.head_dim), v_rows(type, v, c.n_kv, c.n_kv_heads, c.head_dim);
  std::vector<float> k_deq(k.size()), v_deq(v.size());
  dequantize_kv_rows(k_rows.rows(c.n_kv), c.n_kv, c.n_kv_heads, c.head_dim, k_deq.data());
  dequantize_kv_rows(v_rows.rows(c.n_kv), c.n_kv, c.n_kv_heads, c.head_dim, v_deq.data());
  const int64_t pos0 = c.n_kv - c.n_q;
  std::vector<float> want(q.size()), exact(q.size()), got(q.size(), std::nanf(""));
  const std::vector<float> q_scored = query_as_scored(type, q, c.head_dim, q8_parts);
  attention_reference(q_scored.data(), c.n_q, pos0, k_deq.data(), v_deq.data(), c.n_kv, kv_width, shape, want.data());
  attention_reference(q.data(), c.n_q, pos0, k.data(), v.data(), c.n_kv, kv_width, shape, exact.data());
  flash_attention(q.data(), c.n_q, pos0, k_rows.rows(c.n_kv), v_rows.rows(c.n_kv), c.n_kv, shape, got.data());
  const std::string what = std::string(kv_type_info(type).name) + " n_kv " + std::to_string(c.n_kv) + " n_q " +
                           std::to_string(c.n_q) + " head_dim " + std::to_string(c.head_dim) + " query parts " +
                           std::to_string(q8_parts);
  EXPECT_LT(relative_error(got, want), 1e-5) << what;
  EXPECT_LT(relative_error(got, exact), vs_f32_bound) << what;
  for (int64_t block_size : {16, 7}) {
    const BlockTableRows k_blocks(k_rows, c.n_kv, block_size), v_blocks(v_rows, c.n_kv, block_size);
    std::vector<float> paged(q.size(), std::nanf(""));
    flash_attention(q.data(), c.n_q, pos0, k_blocks.rows, v_blocks.rows, c.n_kv, shape, paged.data());
    EXPECT_EQ(paged, got) << what << " block size " << block_size;  // same arithmetic, only addresses differ
  }
}

// Error of the attention output against exact f32 K/V, per storage type.
double vs_f32_bound(KVType type) {
  switch (type) {
    case KVType::F32: return 1e-5;
    case KVType::F16: return 2e-3;
    case KVType::BF16: return 1.5e-2;
    case KVType::Q8_0: return 1.5e-2;
    case KVType::FP8: return 0.15;
    case KVType::Q4_0: return 0.3;
  }
  return 0;
}

}  // namespace

TEST(KvQuant, FlashOverTypedRowsMatchesReference) {
  for_each_isa([] {
    for (KVType type : kAllTypes)
      // Under the sanitizer the long case shrinks to 300 keys: still past a key split (256).
      for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{65}, test_util::skip_slow() ? int64_t{300} : int64_t{1000}})
        for (int64_t hd : n < 300 ? std::vector<int64_t>{32, 128} : std::vector<int64_t>{64}) {
          expect_typed_flash_matches(type, {n, 1, hd, 2, 3}, vs_f32_bound(type));            // decode
          expect_typed_flash_matches(type, {n, std::min<int64_t>(n, 33), hd, 1, 4}, vs_f32_bound(type));  // prefill
        }
  });
}

// The one-part query rotated q8_0 keys are scored with (AttentionShape::q8_query_parts): the reference over the
// same query values, and within q8_0's bound of exact f32 (random keys have no outlier dims to lose).
TEST(KvQuant, FlashOverQ8RowsWithAOnePartQuery) {
  for_each_isa([] {
    for (int64_t n : {int64_t{1}, int64_t{65}, test_util::skip_slow() ? int64_t{300} : int64_t{1000}}) {
      expect_typed_flash_matches(KVType::Q8_0, {n, 1, 64, 2, 7}, vs_f32_bound(KVType::Q8_0), 1);  // decode
      expect_typed_flash_matches(KVType::Q8_0, {n, std::min<int64_t>(n, 33), 128, 2, 6}, vs_f32_bound(KVType::Q8_0),
                                 1);  // prefill
    }
  });
}

TEST(KvQuant, FlashOverTypedRowsWithSmallHeads) {
  // stories260K's head size 8: only the plain types can hold it.
  for_each_isa([] {
    for (KVType type : {KVType::F32, KVType::F16, KVType::BF16})
      for (int64_t n : {1, 63, 65, 1000}) {
        expect_typed_flash_matches(type, {n, 1, 8, 4, 2}, vs_f32_bound(type));
        expect_typed_flash_matches(type, {n, std::min<int64_t>(n, 20), 24, 1, 1}, vs_f32_bound(type));
      }
  });
}

TEST(KvQuant, TypedF32RowsEqualTheContiguousOverload) {
  std::mt19937 rng(9);
  const AttentionShape shape{6, 2, 64};
  const int64_t n_kv = 700, width = 2 * 64;
  const auto q = random_vector(6 * 64, rng, 1.0f);
  const auto k = random_vector(static_cast<size_t>(n_kv * width), rng, 1.0f);
  const auto v = random_vector(static_cast<size_t>(n_kv * width), rng, 1.0f);
  const TypedRows k_rows(KVType::F32, k, n_kv, 2, 64), v_rows(KVType::F32, v, n_kv, 2, 64);
  std::vector<float> a(q.size()), b(q.size());
  flash_attention(q.data(), 1, n_kv - 1, k.data(), v.data(), n_kv, width, shape, a.data());
  flash_attention(q.data(), 1, n_kv - 1, k_rows.rows(n_kv), v_rows.rows(n_kv), n_kv, shape, b.data());
  EXPECT_EQ(a, b);
}

namespace {

// Float weights keep the activations unquantized, so the logits differences
// below come from the KV cache alone.
std::unique_ptr<Model> synth_model(const TempFile& file, const std::string& preset, int layers, DType weights) {
  SynthOptions o;
  o.preset = preset;
  o.type = weights;
  o.output_path = file.path();
  o.seed = 7;
  o.layers = layers;
  synthesize_model(o);
  return Model::load(file.path());
}

// Greedy-decodes with an f32-cache decoder and a kv_type one in lockstep (both
// fed the f32 decoder's tokens); returns the worst logits difference relative
// to the logits' magnitude, and counts the steps whose argmax differs.
double max_logits_diff(const Model& m, KVType kv_type, int steps, int* token_mismatches) {
  auto ref = make_decoder("cached", m, 128);
  auto typed = make_decoder("cached", m, 128, kv_type);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % m.config().vocab_size));
  std::span<const float> a = ref->append(prompt), b = typed->append(prompt);
  double worst = 0;
  *token_mismatches = 0;
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> la(a.begin(), a.end()), lb(b.begin(), b.end());
    worst = std::max(worst, relative_error(lb, la));
    const int32_t t = argmax(la);
    *token_mismatches += t != argmax(lb);
    a = ref->append(std::span<const int32_t>(&t, 1));
    b = typed->append(std::span<const int32_t>(&t, 1));
  }
  return worst;
}

}  // namespace

TEST(KvQuant, DecoderWithHalfPrecisionCacheKeepsGreedyTokens) {
  TempFile f(".gguf");
  auto m = synth_model(f, "tiny-llama", 0, DType::F32);  // head size 16: plain types only
  for (KVType type : {KVType::F16, KVType::BF16}) {
    int mismatches = 0;
    EXPECT_LT(max_logits_diff(*m, type, 6, &mismatches), type == KVType::F16 ? 2e-3 : 2e-2) << kv_type_info(type).name;
    EXPECT_EQ(mismatches, 0) << kv_type_info(type).name;
  }
  EXPECT_THROW(make_decoder("cached", *m, 64, KVType::Q8_0), Error);
}

TEST(KvQuant, DecoderWithBlockQuantizedCacheStaysClose) {
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow under the sanitizers";
  TempFile f(".gguf");
  auto m = synth_model(f, "smollm2-135m", 2, DType::BF16);  // head size 64
  // Random weights give flat logits, so greedy ties can flip; the logits must stay close.
  const std::pair<KVType, double> bounds[] = {
      {KVType::F16, 2e-3}, {KVType::BF16, 2e-2}, {KVType::Q8_0, 2e-2}, {KVType::FP8, 0.1}, {KVType::Q4_0, 0.25}};
  for (const auto& [type, bound] : bounds) {
    int mismatches = 0;
    const double diff = max_logits_diff(*m, type, 4, &mismatches);
    EXPECT_LT(diff, bound) << kv_type_info(type).name;
    std::printf("kv %s: max relative logits difference %.2e, %d argmax changes\n", kv_type_info(type).name, diff,
                mismatches);
  }
}

TEST(KvQuant, DecoderStaysCloseWithTheQuantizedCacheUnrotated) {
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow under the sanitizers";
  TempFile f(".gguf");
  auto m = synth_model(f, "smollm2-135m", 2, DType::BF16);
  // KVSERVE_KV_ROTATION=0 (read when a transformer is made) stores K/V as they come: the A/B baseline.
  struct UnrotatedWhileInScope {
    UnrotatedWhileInScope() { setenv("KVSERVE_KV_ROTATION", "0", 1); }
    ~UnrotatedWhileInScope() { unsetenv("KVSERVE_KV_ROTATION"); }
  };
  int rotated_mismatches = 0, plain_mismatches = 0;
  const double rotated = max_logits_diff(*m, KVType::Q8_0, 4, &rotated_mismatches);
  double plain = 0;
  {
    const UnrotatedWhileInScope unrotated;
    plain = max_logits_diff(*m, KVType::Q8_0, 4, &plain_mismatches);
  }
  EXPECT_LT(plain, 2e-2);
  EXPECT_NE(plain, rotated) << "the variable switched the rotation off";
  std::printf("kv q8_0: max relative logits difference rotated %.2e, unrotated %.2e\n", rotated, plain);
}
