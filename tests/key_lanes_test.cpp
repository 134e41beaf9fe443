// Keys in lanes (kernels/key_lanes.h): every ISA's dot_lanes, dot_lanes_half
// and dot_lanes_q8 against the scalar reference, bit for bit, on awkward head
// sizes, group and row counts; the layout's round trip (the writer, the
// reader, the caches); and flash attention over f16 / bf16 / q8_0 K in lanes against
// the same keys stored one vector per key (transposed as loaded: the same
// bits) and against the materializing reference, for key counts that are no
// multiple of 16, GQA groups of 1 to 8 rows, decode and prefill, windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/dispatch.h"
#include "kernels/flash_attention.h"
#include "kernels/key_lanes.h"
#include "kernels/kv_quant.h"
#include "kv/contiguous_kv_cache.h"
#include "kv/paged_kv_storage.h"
#include "isa_util.h"
#include "test_util.h"

using namespace kvserve;
using ::kvserve::test_util::random_vector;
using ::kvserve::test_util::relative_error;

namespace {

constexpr int64_t kHeadDims[] = {64, 80, 96, 128, 256};

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// n_keys keys of head_dim elements as `type`, in lanes: groups of 16, the
// last one's unused lanes left holding `filler` bits.
struct LaneGroups {
  std::vector<uint8_t> bytes;  // [groups][head_dim][16] elements
  int64_t n_groups;
  LaneGroups(KVType type, const std::vector<float>& keys, int64_t n_keys, int64_t head_dim, uint8_t filler)
      : n_groups((n_keys + kKeyLanes - 1) / kKeyLanes) {
    const size_t group_bytes = kv_head_bytes(type, head_dim) * kKeyLanes;
    bytes.assign(group_bytes * static_cast<size_t>(n_groups), filler);
    for (int64_t j = 0; j < n_keys; ++j)
      quantize_kv_token_lanes(type, 1, head_dim, keys.data() + j * head_dim,
                              bytes.data() + static_cast<size_t>(j / kKeyLanes) * group_bytes, 0, j % kKeyLanes);
  }
  const uint8_t* group(int64_t g, size_t group_bytes) const { return bytes.data() + static_cast<size_t>(g) * group_bytes; }
};

}  // namespace

TEST(KeyLanes, EveryIsaGivesTheScalarReferencesBits) {
  std::mt19937 rng(41);
  for (int64_t hd : {8, 13, 64, 80, 96, 128, 256}) {
    for (int64_t n_groups : {1, 2, 3, 4, 5, 9}) {
      const int64_t n = n_groups * kKeyLanes * hd;
      const std::vector<float> lanes = random_vector(static_cast<size_t>(n), rng, 1.0f);
      std::vector<const float*> groups;
      for (int64_t g = 0; g < n_groups; ++g) groups.push_back(lanes.data() + g * hd * kKeyLanes);
      std::vector<std::vector<float>> q(4);
      for (auto& row : q) row = random_vector(static_cast<size_t>(hd), rng, 1.0f);
      const float* qs[4] = {q[0].data(), q[1].data(), q[2].data(), q[3].data()};
      for (int n_rows = 1; n_rows <= kAttentionRowsPerCall; ++n_rows) {
        std::vector<std::vector<float>> want(4, std::vector<float>(static_cast<size_t>(n_groups * kKeyLanes)));
        float* ws[4] = {want[0].data(), want[1].data(), want[2].data(), want[3].data()};
        scalar_dot_lanes(qs, n_rows, groups.data(), n_groups, hd, ws);
        test_util::for_each_isa([&] {
          std::vector<std::vector<float>> got(4, std::vector<float>(want[0].size(), -1.0f));
          float* gs[4] = {got[0].data(), got[1].data(), got[2].data(), got[3].data()};
          attention_vector_ops().dot_lanes(qs, n_rows, groups.data(), n_groups, hd, gs);
          for (int r = 0; r < n_rows; ++r)
            for (size_t j = 0; j < want[0].size(); ++j)
              ASSERT_TRUE(same_bits(got[r][j], want[r][j]))
                  << isa_name(active_isa()) << " hd " << hd << " groups " << n_groups << " rows " << n_rows << " row "
                  << r << " key " << j << ": " << got[r][j] << " vs " << want[r][j];
        });
      }
    }
  }
}

namespace {

// Query rows quantized for q8_0 keys, with the arrays QueryQ8 points into.
struct QuantizedRows {
  std::vector<std::vector<int8_t>> q;
  std::vector<std::vector<float>> d;
  std::vector<std::vector<int32_t>> sum;
  std::vector<QueryQ8> rows;
  int parts;
  QuantizedRows(const std::vector<std::vector<float>>& x, int64_t hd, int n_parts = 2) : parts(n_parts) {
    for (const auto& row : x) {
      q.emplace_back(static_cast<size_t>(2 * hd));
      d.emplace_back(static_cast<size_t>(hd / 32));
      sum.emplace_back(static_cast<size_t>(2 * hd / 32));
      quantize_query_q8(row.data(), hd, parts, q.back().data(), d.back().data(), sum.back().data());
    }
    for (size_t r = 0; r < x.size(); ++r) rows.push_back({q[r].data(), d[r].data(), sum[r].data(), parts});
  }
  // Row r as the floats its parts stand for.
  std::vector<float> values(size_t r) const {
    const size_t n = q[r].size() / 2;
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) {
      const double low = parts == 2 ? double(q[r][n + i]) * kQueryLowStep : 0.0;
      out[i] = static_cast<float>(d[r][i / 32] * (q[r][i] + low));
    }
    return out;
  }
};

}  // namespace

// q8_0 keys in lanes: every ISA's dot_lanes_q8 gives the scalar reference's
// bits, and the reference is the dot of the dequantized key with the
// dequantized query (within float rounding), for a query in two parts and in
// one; the last group's unused lanes hold garbage bytes and are not read back.
TEST(KeyLanes, EveryIsaGivesTheQ8ReferencesBits) {
  std::mt19937 rng(42);
  for (int parts : {2, 1}) {
    for (int64_t hd : {32, 64, 96, 128, 576}) {
      for (int64_t n_keys : {1, 16, 17, 40, 64, 100, 144}) {
        const std::vector<float> keys = random_vector(static_cast<size_t>(n_keys * hd), rng, 2.0f);
        const LaneGroups stored(KVType::Q8_0, keys, n_keys, hd, 0xA5);
        const size_t group_bytes = kv_head_bytes(KVType::Q8_0, hd) * kKeyLanes;
        std::vector<const uint8_t*> groups;
        for (int64_t g = 0; g < stored.n_groups; ++g) groups.push_back(stored.group(g, group_bytes));
        std::vector<std::vector<float>> x(4);
        for (auto& row : x) row = random_vector(static_cast<size_t>(hd), rng, 1.5f);
        const QuantizedRows q(x, hd, parts);
        const size_t width = static_cast<size_t>(stored.n_groups * kKeyLanes);
        for (int n_rows = 1; n_rows <= kAttentionRowsPerCall; ++n_rows) {
          std::vector<std::vector<float>> want(4, std::vector<float>(width));
          float* ws[4] = {want[0].data(), want[1].data(), want[2].data(), want[3].data()};
          scalar_dot_lanes_q8(q.rows.data(), n_rows, groups.data(), stored.n_groups, hd, ws);
          for (int r = 0; r < n_rows; ++r) {
            const std::vector<float> qv = q.values(static_cast<size_t>(r));
            for (int64_t j = 0; j < n_keys; ++j) {
              std::vector<float> k(static_cast<size_t>(hd));
              dequantize_key_lane(KVType::Q8_0, stored.group(j / kKeyLanes, group_bytes), j % kKeyLanes, hd, k.data());
              double dot = 0, scale = 0;
              for (int64_t i = 0; i < hd; ++i) dot += double(qv[i]) * k[i], scale += std::abs(double(qv[i]) * k[i]);
              ASSERT_NEAR(want[r][j], dot, 1e-5 * scale + 1e-30)
                  << "parts " << parts << " hd " << hd << " key " << j;
            }
          }
          test_util::for_each_isa([&] {
            std::vector<std::vector<float>> got(4, std::vector<float>(width, -1.0f));
            float* gs[4] = {got[0].data(), got[1].data(), got[2].data(), got[3].data()};
            attention_vector_ops().dot_lanes_q8(q.rows.data(), n_rows, groups.data(), stored.n_groups, hd, gs);
            for (int r = 0; r < n_rows; ++r)
              for (int64_t j = 0; j < n_keys; ++j)
                ASSERT_TRUE(same_bits(got[r][j], want[r][j]))
                    << isa_name(active_isa()) << " parts " << parts << " hd " << hd << " keys " << n_keys
                    << " rows " << n_rows << " row " << r << " key " << j << ": " << got[r][j] << " vs " << want[r][j];
          });
        }
      }
    }
  }
}

// Each row of a quantized query stands for its floats within half a step of
// its second part (max|x| / 127 / 256), the first part alone within half a
// step of its own, the second part stays in [-64, 64], and the sums are the
// parts' sums.
TEST(KeyLanes, QueryQuantizationRoundsToNearestStep) {
  std::mt19937 rng(44);
  for (int64_t hd : {32, 96, 576}) {
    std::vector<float> x = random_vector(static_cast<size_t>(hd), rng, 4.0f);
    for (int64_t i = 32; i < 64 && i < hd; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
    const QuantizedRows q({x}, hd);
    const std::vector<float> values = q.values(0);
    for (int64_t b = 0; b < hd / 32; ++b) {
      int32_t high = 0, low = 0;
      for (int64_t i = b * 32; i < (b + 1) * 32; ++i) {
        high += q.q[0][i];
        low += q.q[0][hd + i];
        EXPECT_LE(std::abs(q.d[0][b] * q.q[0][i] - x[i]), q.d[0][b] * 0.5f * (1 + 1e-5f) + 1e-30f) << "hd " << hd;
        EXPECT_LE(std::abs(q.q[0][hd + i]), 64) << "hd " << hd << " i " << i;
        EXPECT_LE(std::abs(values[i] - x[i]), q.d[0][b] * kQueryLowStep * 0.5f * (1 + 1e-3f) + 1e-30f)
            << "hd " << hd << " i " << i << ": " << values[i] << " vs " << x[i];
      }
      EXPECT_EQ(high, q.sum[0][b]);
      EXPECT_EQ(low, q.sum[0][hd / 32 + b]);
    }
  }
}

// A one-part query is the two-part query's first part: the same bytes, steps
// and first sums (rotated keys are scored with it; docs/attention.md).
TEST(KeyLanes, OnePartQueryIsTheTwoPartsFirst) {
  std::mt19937 rng(45);
  for (int64_t hd : {32, 128, 576}) {
    const std::vector<float> x = random_vector(static_cast<size_t>(hd), rng, 3.0f);
    const QuantizedRows two({x}, hd, 2), one({x}, hd, 1);
    EXPECT_EQ(one.rows[0].parts, 1);
    EXPECT_TRUE(std::equal(one.q[0].begin(), one.q[0].begin() + hd, two.q[0].begin())) << "hd " << hd;
    EXPECT_EQ(one.d[0], two.d[0]) << "hd " << hd;
    EXPECT_TRUE(std::equal(one.sum[0].begin(), one.sum[0].begin() + hd / 32, two.sum[0].begin())) << "hd " << hd;
  }
}

// axpy_keys_q8 widens q8_0 rows as they load: the bits of dequantizing first.
TEST(KeyLanes, Q8ValuesWidenedAsLoadedEqualDequantizedFirst) {
  std::mt19937 rng(46);
  for (int64_t hd : {32, 64, 96, 160, 576}) {
    const int64_t n_keys = 37;
    std::vector<std::vector<uint8_t>> rows;
    std::vector<std::vector<float>> widened;
    std::vector<const uint8_t*> row_ptrs;
    std::vector<const float*> widened_ptrs;
    for (int64_t j = 0; j < n_keys; ++j) {
      const std::vector<float> v = random_vector(static_cast<size_t>(hd), rng, 2.0f);
      rows.emplace_back(kv_head_bytes(KVType::Q8_0, hd));
      quantize_kv_row(KVType::Q8_0, v.data(), rows.back().data(), hd);
      widened.emplace_back(static_cast<size_t>(hd));
      dequantize_kv_row_scalar(KVType::Q8_0, rows.back().data(), widened.back().data(), hd);
    }
    for (int64_t j = 0; j < n_keys; ++j) row_ptrs.push_back(rows[j].data()), widened_ptrs.push_back(widened[j].data());
    std::vector<std::vector<float>> p(4);
    for (auto& row : p) row = random_vector(static_cast<size_t>(n_keys), rng, 1.0f);
    const float* ps[4] = {p[0].data(), p[1].data(), p[2].data(), p[3].data()};
    test_util::for_each_isa([&] {
      const AttentionVectorOps& ops = attention_vector_ops();
      if (!ops.axpy_keys_q8) return;
      for (int n_rows = 1; n_rows <= kAttentionRowsPerCall; ++n_rows) {
        std::vector<std::vector<float>> a(4, random_vector(static_cast<size_t>(hd), rng, 1.0f)), b = a;
        float* as[4] = {a[0].data(), a[1].data(), a[2].data(), a[3].data()};
        float* bs[4] = {b[0].data(), b[1].data(), b[2].data(), b[3].data()};
        ops.axpy_keys_q8(ps, n_rows, row_ptrs.data(), n_keys, as, hd);
        ops.axpy_keys(ps, n_rows, widened_ptrs.data(), n_keys, bs, hd);
        for (int r = 0; r < n_rows; ++r)
          for (int64_t i = 0; i < hd; ++i)
            ASSERT_TRUE(same_bits(a[r][i], b[r][i])) << isa_name(active_isa()) << " hd " << hd << " rows " << n_rows;
      }
    });
  }
}

// The _half forms widen as they load: the bits of widening first and calling dot_lanes.
TEST(KeyLanes, WidenedAsLoadedEqualsWidenedFirst) {
  std::mt19937 rng(43);
  for (KVType type : {KVType::F16, KVType::BF16}) {
    for (int64_t hd : kHeadDims) {
      for (int64_t n_keys : {1, 15, 17, 40, 64, 100}) {
        const std::vector<float> keys = random_vector(static_cast<size_t>(n_keys * hd), rng, 1.0f);
        const LaneGroups stored(type, keys, n_keys, hd, 0);
        const size_t group_bytes = kv_head_bytes(type, hd) * kKeyLanes;
        std::vector<float> widened(static_cast<size_t>(stored.n_groups * hd * kKeyLanes));
        dequantize_kv_row_scalar(type, stored.bytes.data(), widened.data(), static_cast<int64_t>(widened.size()));
        std::vector<const float*> full;
        std::vector<const uint16_t*> half;
        for (int64_t g = 0; g < stored.n_groups; ++g) {
          full.push_back(widened.data() + g * hd * kKeyLanes);
          half.push_back(reinterpret_cast<const uint16_t*>(stored.group(g, group_bytes)));
        }
        std::vector<std::vector<float>> q(4);
        for (auto& row : q) row = random_vector(static_cast<size_t>(hd), rng, 1.0f);
        const float* qs[4] = {q[0].data(), q[1].data(), q[2].data(), q[3].data()};
        test_util::for_each_isa([&] {
          const AttentionVectorOps& ops = attention_vector_ops();
          if (!ops.dot_lanes_half) return;
          for (int n_rows = 1; n_rows <= kAttentionRowsPerCall; ++n_rows) {
            const size_t width = static_cast<size_t>(stored.n_groups * kKeyLanes);
            std::vector<std::vector<float>> a(4, std::vector<float>(width)), b = a;
            float* as[4] = {a[0].data(), a[1].data(), a[2].data(), a[3].data()};
            float* bs[4] = {b[0].data(), b[1].data(), b[2].data(), b[3].data()};
            ops.dot_lanes_half(type, qs, n_rows, half.data(), stored.n_groups, hd, as);
            scalar_dot_lanes(qs, n_rows, full.data(), stored.n_groups, hd, bs);
            for (int r = 0; r < n_rows; ++r)
              for (int64_t j = 0; j < n_keys; ++j)
                ASSERT_TRUE(same_bits(a[r][j], b[r][j])) << isa_name(active_isa()) << " hd " << hd << " key " << j;
          }
        });
      }
    }
  }
}

// Each key written into its lane reads back as the vector the rows writer stores.
TEST(KeyLanes, WriterAndReaderRoundTrip) {
  std::mt19937 rng(47);
  for (KVType type : {KVType::F16, KVType::BF16, KVType::Q8_0}) {
    for (int64_t hd : {32, 96, 128, 256}) {
      const int64_t n_heads = 3, n_keys = 16;
      const size_t head_bytes = kv_head_bytes(type, hd), head_stride = head_bytes * kKeyLanes;
      std::vector<uint8_t> group(head_stride * n_heads, 0xCD);
      std::vector<std::vector<float>> keys;
      for (int64_t lane = 0; lane < n_keys; ++lane) {
        keys.push_back(random_vector(static_cast<size_t>(n_heads * hd), rng, 3.0f));
        quantize_kv_token_lanes(type, n_heads, hd, keys.back().data(), group.data(), head_stride, lane);
      }
      for (int64_t lane = 0; lane < n_keys; ++lane)
        for (int64_t h = 0; h < n_heads; ++h) {
          std::vector<uint8_t> row(head_bytes);
          std::vector<float> want(static_cast<size_t>(hd)), got(static_cast<size_t>(hd));
          quantize_kv_row(type, keys[lane].data() + h * hd, row.data(), hd);
          dequantize_kv_row_scalar(type, row.data(), want.data(), hd);
          dequantize_key_lane(type, group.data() + h * head_stride, lane, hd, got.data());
          ASSERT_EQ(got, want) << kv_type_info(type).name << " hd " << hd << " lane " << lane << " head " << h;
        }
    }
  }
}

namespace {

// n_kv random K/V rows written into a contiguous cache and into a paged
// storage (blocks of block_size, handed out in reverse order).
struct TwoCaches {
  std::vector<float> k, v;  // [n_kv][n_kv_heads * head_dim]
  ContiguousKVCache contiguous;
  PagedKVStorage paged;
  std::vector<const uint8_t*> k_bases, v_bases;
  TwoCaches(KVType type, int64_t n_kv, int64_t n_kv_heads, int64_t hd, int64_t block_size, std::mt19937& rng)
      : k(random_vector(static_cast<size_t>(n_kv * n_kv_heads * hd), rng, 1.0f)),
        v(random_vector(k.size(), rng, 1.0f)), contiguous(1, n_kv, n_kv_heads, hd, type),
        paged(1, (n_kv + block_size - 1) / block_size, block_size, n_kv_heads, hd, type) {
    const int64_t n_blocks = paged.n_blocks(), kvd = n_kv_heads * hd;
    std::vector<BlockId> table;
    for (int64_t b = 0; b < n_blocks; ++b) table.push_back(static_cast<BlockId>(n_blocks - 1 - b));
    for (int64_t p = 0; p < n_kv; ++p) {
      contiguous.write(0, p, k.data() + p * kvd, v.data() + p * kvd);
      paged.write(0, table[static_cast<size_t>(p / block_size)], p % block_size, k.data() + p * kvd, v.data() + p * kvd);
    }
    paged.append_block_bases(0, table, k_bases, v_bases);
  }
};

}  // namespace

// The caches store f16 / bf16 K in lanes (blocks of whole groups), and
// materializing their rows gives each key's vector as the rows writer stores it.
TEST(KeyLanes, CachesStoreKeysInLanesAndReadThemBack) {
  std::mt19937 rng(53);
  for (KVType type : {KVType::F16, KVType::BF16, KVType::Q8_0}) {
    const int64_t n_kv = 300, heads = 2, hd = type == KVType::Q8_0 ? 96 : 80;
    for (int64_t block_size : {16, 32, 5}) {
      const TwoCaches c(type, n_kv, heads, hd, block_size, rng);
      EXPECT_TRUE(c.contiguous.k_rows(0).keys_in_lanes);
      EXPECT_FALSE(c.contiguous.v_rows(0).keys_in_lanes);
      EXPECT_EQ(c.paged.k_rows(c.k_bases.data()).keys_in_lanes, block_size % kKeyLanes == 0);
      std::vector<float> want(c.k.size()), from_contiguous(c.k.size()), from_paged(c.k.size());
      for (int64_t p = 0; p < n_kv * heads; ++p) {
        std::vector<uint8_t> row(kv_head_bytes(type, hd));
        quantize_kv_row(type, c.k.data() + p * hd, row.data(), hd);
        dequantize_kv_row_scalar(type, row.data(), want.data() + p * hd, hd);
      }
      dequantize_kv_rows(c.contiguous.k_rows(0), n_kv, heads, hd, from_contiguous.data());
      dequantize_kv_rows(c.paged.k_rows(c.k_bases.data()), n_kv, heads, hd, from_paged.data());
      EXPECT_EQ(from_contiguous, want) << kv_type_info(type).name;
      EXPECT_EQ(from_paged, want) << kv_type_info(type).name << " block size " << block_size;
    }
  }
  // MLA's latent rows are V too: they stay vectors.
  EXPECT_FALSE(ContiguousKVCache(1, 32, 1, 64, KVType::F16, {}, true).k_rows(0).keys_in_lanes);
  EXPECT_FALSE(stores_keys_in_lanes(KVType::F32, 16, false));
  EXPECT_TRUE(stores_keys_in_lanes(KVType::Q8_0, 16, false));
  EXPECT_FALSE(stores_keys_in_lanes(KVType::Q4_0, 16, false));
  EXPECT_FALSE(stores_keys_in_lanes(KVType::FP8, 16, false));
}

// Flash attention over K in lanes (the caches) equals flash attention over the
// same keys stored one vector per key (a paged block of 5, transposed as
// loaded) bit for bit, and the materializing reference within float rounding,
// on every ISA: decode and prefill rows, key counts that are no multiple of
// 16, GQA groups of 1 to 8, windows.
TEST(KeyLanes, FlashOverLanesMatchesVectorsAndTheReference) {
  std::mt19937 rng(59);
  struct Case { int64_t n_kv, n_q, hd, group, window; };
  const Case cases[] = {{1, 1, 64, 3, 0},    {15, 15, 80, 1, 0},   {17, 3, 96, 8, 0},   {100, 1, 128, 7, 0},
                        {300, 1, 256, 2, 0}, {529, 40, 64, 3, 0},  {530, 1, 64, 4, 37}, {700, 17, 80, 5, 100},
                        {1030, 1, 96, 6, 0}, {333, 333, 64, 2, 0}};
  for (KVType type : {KVType::F16, KVType::BF16, KVType::Q8_0}) {
    for (const Case& c : cases) {
      if (!kv_type_fits(type, c.hd)) continue;
      const int64_t heads = 2;
      const AttentionShape shape{heads * c.group, heads, c.hd, c.window};
      const TwoCaches lanes(type, c.n_kv, heads, c.hd, 16, rng);
      PagedKVStorage vectors(1, (c.n_kv + 4) / 5, 5, heads, c.hd, type);
      std::vector<BlockId> table;
      for (int64_t b = 0; b < vectors.n_blocks(); ++b) table.push_back(static_cast<BlockId>(b));
      const int64_t kvd = heads * c.hd;
      for (int64_t p = 0; p < c.n_kv; ++p)
        vectors.write(0, table[static_cast<size_t>(p / 5)], p % 5, lanes.k.data() + p * kvd, lanes.v.data() + p * kvd);
      std::vector<const uint8_t*> kb, vb;
      vectors.append_block_bases(0, table, kb, vb);
      const std::vector<float> q = random_vector(static_cast<size_t>(c.n_q * shape.n_heads * c.hd), rng, 1.0f);
      const int64_t pos0 = c.n_kv - c.n_q;
      std::vector<float> k_deq(lanes.k.size()), v_deq(lanes.k.size()), want(q.size());
      dequantize_kv_rows(lanes.contiguous.k_rows(0), c.n_kv, heads, c.hd, k_deq.data());
      dequantize_kv_rows(lanes.contiguous.v_rows(0), c.n_kv, heads, c.hd, v_deq.data());
      attention_reference(q.data(), c.n_q, pos0, k_deq.data(), v_deq.data(), c.n_kv, kvd, shape, want.data());
      const std::string what = std::string(kv_type_info(type).name) + " n_kv " + std::to_string(c.n_kv) + " n_q " +
                               std::to_string(c.n_q) + " hd " + std::to_string(c.hd) + " group " + std::to_string(c.group);
      test_util::for_each_isa([&] {
        std::vector<float> a(q.size(), -7.0f), b = a, d = a;
        flash_attention(q.data(), c.n_q, pos0, lanes.contiguous.k_rows(0), lanes.contiguous.v_rows(0), c.n_kv, shape,
                        a.data());
        flash_attention(q.data(), c.n_q, pos0, lanes.paged.k_rows(lanes.k_bases.data()),
                        lanes.paged.v_rows(lanes.v_bases.data()), c.n_kv, shape, b.data());
        flash_attention(q.data(), c.n_q, pos0, vectors.k_rows(kb.data()), vectors.v_rows(vb.data()), c.n_kv, shape,
                        d.data());
        EXPECT_EQ(a, b) << what << " " << isa_name(active_isa());
        EXPECT_EQ(a, d) << what << " " << isa_name(active_isa());
        // q8_0 keys are scored against the query rounded to 8 bits per 32 values.
        EXPECT_LT(relative_error(a, want), type == KVType::Q8_0 ? 2e-2 : 1e-5) << what << " " << isa_name(active_isa());
      });
    }
  }
}
