#include "kernels/flash_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/flash_attention_tile.h"
#include "kernels/key_lanes.h"

namespace kvserve {
using namespace flash_detail;
namespace {

// What one work item reads: the K/V rows, which head, and the inner-loop ops.
struct HeadSource {
  const KVRows* k;
  const KVRows* v;
  size_t k_offset, v_offset;  // bytes from a token's first head to this one (KVRows::head)
  int64_t head_dim;
  float scale;                // of q.k (AttentionShape::score_scale)
  const AttentionVectorOps* ops;
};

// f(t, token t's bytes) for t in [from, t1), walking the block table once
// (KVRows::token divides per key: a tenth of decode attention's time).
template <typename F>
void for_each_token(const KVRows& rows, int64_t from, int64_t t1, F&& f) {
  int64_t block = from / rows.block_size, at = from % rows.block_size;
  for (int64_t t = from; t < t1; ++t, ++at) {
    if (at == rows.block_size) ++block, at = 0;
    f(t, rows.blocks[block] + static_cast<size_t>(at) * rows.token_stride);
  }
}

// Loads keys [from, t1) of the tile that starts at t0 into out[t - t0]. Keys
// before `from` are left alone: no row sees them, and in the paged cache their
// block may have been freed (a sliding layer's keys that left every window).
// Pointers to the stored rows themselves (f32, or f16 / bf16 / q8_0 widened as they load).
template <typename T>
void stored_rows(const KVRows& rows, size_t offset, int64_t t0, int64_t from, int64_t t1, const T** out) {
  for_each_token(rows, from, t1, [&](int64_t t, const uint8_t* p) { out[t - t0] = reinterpret_cast<const T*>(p + offset); });
}

void load_rows(const KVRows& rows, size_t offset, const AttentionVectorOps& ops, int64_t head_dim, int64_t t0,
               int64_t from, int64_t t1, std::vector<float>& buf, const float** out) {
  if (rows.type == KVType::F32) return stored_rows(rows, offset, t0, from, t1, out);
  buf.resize(static_cast<size_t>(kKeyTile * head_dim));
  for_each_token(rows, from, t1, [&](int64_t t, const uint8_t* p) {
    float* dst = buf.data() + (t - t0) * head_dim;
    ops.dequantize(rows.type, p + offset, dst, head_dim);
    out[t - t0] = dst;
  });
}

// A tile read by many rows (prefill) is dequantized once for all of them; a
// decode tile (one or two calls: a GQA group of up to 8 query heads, as
// Qwen2.5's 7) is widened as it loads, straight from memory. The same bits
// either way: a speed choice only.
constexpr int64_t kMaxRowsWidenedAsLoaded = 2 * kAttentionRowsPerCall;

// Groups of kKeyLanes keys covering keys [from, t1) of the tile at t0: [g0, g1).
std::pair<int64_t, int64_t> lane_groups(int64_t t0, int64_t from, int64_t t1) {
  return {(from - t0) / kKeyLanes, (t1 - t0 + kKeyLanes - 1) / kKeyLanes};
}

// f32 groups in tile.k_lanes_buf from K stored one vector per key (the
// tests' rows, a paged block of a size that is no whole number of groups, MLA):
// each key's vector dequantized, then transposed into its lane. Lanes of keys
// outside [from, t1) are zeros (their scores are computed and never read).
void transpose_keys_into_lanes(const HeadSource& src, int64_t t0, int64_t from, int64_t t1, KVTile& tile) {
  const int64_t hd = src.head_dim;
  load_rows(*src.k, src.k_offset, *src.ops, hd, t0, from, t1, tile.k_buf, tile.k);
  const auto [g0, g1] = lane_groups(t0, from, t1);
  float* lanes = tile.k_lanes_buf.data();
  std::fill(lanes + g0 * hd * kKeyLanes, lanes + g1 * hd * kKeyLanes, 0.0f);
  for (int64_t t = from; t < t1; ++t) {
    float* dst = lanes + (t - t0) / kKeyLanes * hd * kKeyLanes + (t - t0) % kKeyLanes;
    for (int64_t d = 0; d < hd; ++d) dst[d * kKeyLanes] = tile.k[t - t0][d];
  }
}

// q8_0 K in lanes: the stored groups, or groups of the stored vectors (keys
// outside [from, t1) zero) transposed into tile.k_q8_buf.
void load_q8_key_lanes(const HeadSource& src, int64_t t0, int64_t from, int64_t t1, KVTile& tile) {
  const KVRows& k = *src.k;
  const auto [g0, g1] = lane_groups(t0, from, t1);
  tile.k_lanes_q8 = true;
  if (k.keys_in_lanes) {
    for (int64_t g = g0; g < g1; ++g) tile.k_group_q8[g] = k.lane_group(t0 + g * kKeyLanes, 0) + src.k_offset;
    return;
  }
  const size_t group_bytes = kKeyLanes * kv_head_bytes(KVType::Q8_0, src.head_dim);
  tile.k_q8_buf.resize(KVTile::kGroups * group_bytes);
  const uint8_t* rows[kKeyLanes];
  for (int64_t g = g0; g < g1; ++g) {
    std::fill(rows, rows + kKeyLanes, nullptr);
    const int64_t first = std::max(from, t0 + g * kKeyLanes), last = std::min(t1, t0 + (g + 1) * kKeyLanes);
    for_each_token(k, first, last, [&](int64_t t, const uint8_t* p) { rows[(t - t0) % kKeyLanes] = p + src.k_offset; });
    uint8_t* group = tile.k_q8_buf.data() + g * group_bytes;
    transpose_q8_rows_into_lanes(rows, src.head_dim, group);
    tile.k_group_q8[g] = group;
  }
}

// K scored in lanes: the groups covering keys [from, t1), as stored (f16 / bf16 widened
// as they load) where few rows read them, else widened once into f32 groups; q8_0 as above.
void load_key_lanes(const HeadSource& src, bool widen_as_loaded, int64_t t0, int64_t from, int64_t t1, KVTile& tile) {
  const KVRows& k = *src.k;
  const int64_t hd = src.head_dim;
  const auto [g0, g1] = lane_groups(t0, from, t1);
  tile.k_lanes = true;
  tile.k_type = k.type;
  if (k.type == KVType::Q8_0) return load_q8_key_lanes(src, t0, from, t1, tile);
  tile.k_lanes_half = k.keys_in_lanes && widen_as_loaded && src.ops->dot_lanes_half != nullptr;
  const auto group = [&](int64_t g) { return k.lane_group(t0 + g * kKeyLanes, 0) + src.k_offset; };
  if (tile.k_lanes_half) {
    for (int64_t g = g0; g < g1; ++g) tile.k_group_half[g] = reinterpret_cast<const uint16_t*>(group(g));
    return;
  }
  tile.k_lanes_buf.resize(static_cast<size_t>(kKeyTile * hd));
  for (int64_t g = 0; g < KVTile::kGroups; ++g) tile.k_group[g] = tile.k_lanes_buf.data() + g * hd * kKeyLanes;
  if (!k.keys_in_lanes) return transpose_keys_into_lanes(src, t0, from, t1, tile);
  for (int64_t g = g0; g < g1; ++g)
    src.ops->dequantize(k.type, group(g), tile.k_lanes_buf.data() + g * hd * kKeyLanes, hd * kKeyLanes);
}

void load_tile(const HeadSource& src, int64_t n_rows, int64_t t0, int64_t from, int64_t t1, KVTile& tile) {
  const bool widen = n_rows <= kMaxRowsWidenedAsLoaded;
  tile.k_lanes = false;
  tile.k_lanes_q8 = false;
  if (scores_in_lanes(src.k->type)) load_key_lanes(src, widen, t0, from, t1, tile);
  else load_rows(*src.k, src.k_offset, *src.ops, src.head_dim, t0, from, t1, tile.k_buf, tile.k);
  const KVType vt = src.v->type;
  tile.v_half = widen && (vt == KVType::F16 || vt == KVType::BF16) && src.ops->axpy_keys_half != nullptr;
  tile.v_type = vt;
  tile.v_q8 = widen && vt == KVType::Q8_0 && src.ops->axpy_keys_q8 != nullptr;
  if (tile.v_half) stored_rows(*src.v, src.v_offset, t0, from, t1, tile.v_half_rows);
  else if (tile.v_q8) stored_rows(*src.v, src.v_offset, t0, from, t1, tile.v_q8_rows);
  else load_rows(*src.v, src.v_offset, *src.ops, src.head_dim, t0, from, t1, tile.v_buf, tile.v);
}

// Scores of keys [begin, last) of the tile at t0 for n rows: scores[i][j - t0]
// for key j (a lane group's other keys are scored too, and not read).
void score_keys(const float* const* q, const QueryQ8* q8, int n, const KVTile& tile, const HeadSource& src,
                int64_t t0, int64_t begin, int64_t last, float (*scores)[kKeyTile]) {
  float* out[kAttentionRowsPerCall];
  if (!tile.k_lanes) {
    for (int i = 0; i < n; ++i) out[i] = scores[i] + (begin - t0);
    return src.ops->dot_keys(q, n, tile.k + (begin - t0), last - begin, src.head_dim, out);
  }
  const auto [g0, g1] = lane_groups(t0, begin, last);
  for (int i = 0; i < n; ++i) out[i] = scores[i] + g0 * kKeyLanes;
  const int64_t hd = src.head_dim;
  if (tile.k_lanes_q8) src.ops->dot_lanes_q8(q8, n, tile.k_group_q8 + g0, g1 - g0, hd, out);
  else if (tile.k_lanes_half) src.ops->dot_lanes_half(tile.k_type, q, n, tile.k_group_half + g0, g1 - g0, hd, out);
  else src.ops->dot_lanes(q, n, tile.k_group + g0, g1 - g0, hd, out);
}

// Folds the tile's keys [begin, last) into the states of rows [r0, r0 + n)
// (n <= kAttentionRowsPerCall rows that see the same keys; the tile starts at
// t0). Each row's arithmetic is what it would be alone: the row ops take
// several rows only to share the key loads.
void attend_tile_rows(RowBlock& rows, int64_t r0, int n, const KVTile& tile, const HeadSource& src, int64_t t0,
                      int64_t begin, int64_t last) {
  const int64_t hd = src.head_dim, n_keys = last - begin;
  float scores[kAttentionRowsPerCall][kKeyTile];
  const float* q[kAttentionRowsPerCall];
  float* s[kAttentionRowsPerCall];
  float* o[kAttentionRowsPerCall];
  for (int i = 0; i < n; ++i) {
    q[i] = rows.q[r0 + i];
    s[i] = scores[i] + (begin - t0);
    o[i] = rows.acc.data() + (r0 + i) * hd;
  }
  score_keys(q, rows.q8 ? rows.q8 + r0 : nullptr, n, tile, src, t0, begin, last, scores);
  for (int i = 0; i < n; ++i) {
    const float tile_max = src.ops->scale_max(s[i], n_keys, src.scale);
    OnlineSoftmax& st = rows.state[r0 + i];
    const float new_max = std::max(st.max, tile_max);
    const float rescale = st.max == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(st.max - new_max);
    if (rescale != 1.0f) src.ops->scale(rescale, o[i], hd);
    st.sum = st.sum * rescale + src.ops->exp_sum(s[i], n_keys, new_max);  // scores become the weights p
    st.max = new_max;
  }
  if (tile.v_half) src.ops->axpy_keys_half(tile.v_type, s, n, tile.v_half_rows + (begin - t0), n_keys, o, hd);
  else if (tile.v_q8) src.ops->axpy_keys_q8(s, n, tile.v_q8_rows + (begin - t0), n_keys, o, hd);
  else src.ops->axpy_keys(s, n, tile.v + (begin - t0), n_keys, o, hd);
}

// Folds keys [j0, j1) of the source head into every row's state, one tile
// of keys at a time; each tile is dequantized once for all rows. Not
// inlined: prefill and decode run one compiled copy of the per-row
// arithmetic (no per-call-site contraction or vectorization differences).
[[gnu::noinline]] void attend_keys(RowBlock& rows, const HeadSource& src, int64_t j0, int64_t j1, KVTile& tile) {
  int64_t max_pos = -1, min_first = j1;
  for (int64_t r = 0; r < rows.n_rows; ++r) {
    max_pos = std::max(max_pos, rows.pos[r]);
    min_first = std::min(min_first, rows.first[r]);
  }
  j1 = std::min(j1, max_pos + 1);  // causal: no row sees keys past its position
  // Sliding window: tiles wholly before every row's window are skipped; the
  // tile grid stays where it is (a row's arithmetic never depends on the others).
  const int64_t start = min_first > j0 ? j0 + (min_first - j0) / kKeyTile * kKeyTile : j0;
  for (int64_t t0 = start; t0 < j1; t0 += kKeyTile) {
    const int64_t t1 = std::min(j1, t0 + kKeyTile), from = std::max(t0, min_first);
    load_tile(src, rows.n_rows, t0, from, t1, tile);
    // Runs of consecutive rows that see the same keys of the tile (the query
    // heads of one position; every row of a tile wholly in view) go together.
    const auto range = [&](int64_t r) {
      return std::pair{std::max(t0, rows.first[r]), std::min(t1, rows.pos[r] + 1)};
    };
    for (int64_t r = 0; r < rows.n_rows;) {
      const auto [begin, last] = range(r);
      int n = 1;
      while (n < kAttentionRowsPerCall && r + n < rows.n_rows && range(r + n) == std::pair{begin, last}) ++n;
      if (last > begin) attend_tile_rows(rows, r, n, tile, src, t0, begin, last);  // else: no key of the tile in view
      r += n;
    }
  }
}

// Starts a key split: every row's split state empty.
void reset_split(RowBlock& rows, int64_t head_dim) {
  rows.state.assign(static_cast<size_t>(rows.n_rows), OnlineSoftmax{});
  rows.acc.assign(static_cast<size_t>(rows.n_rows * head_dim), 0.0f);
}

void reset_rows(RowBlock& rows, int64_t n_rows, int64_t head_dim) {
  rows.n_rows = n_rows;
  rows.q.resize(static_cast<size_t>(n_rows));
  rows.pos.resize(static_cast<size_t>(n_rows));
  rows.first.resize(static_cast<size_t>(n_rows));
  rows.merged.assign(static_cast<size_t>(n_rows), OnlineSoftmax{});
  rows.merged_acc.assign(static_cast<size_t>(n_rows * head_dim), 0.0f);
  rows.q8 = nullptr;
  reset_split(rows, head_dim);
}

// Folds one split's partial state (max, sum, output) of a row into the
// row's running merge. The only place partial states are combined: prefill
// and decode call it in split order, so they give the same bits (one
// compiled copy: not inlined). A split the row saw no key of (max -inf) is
// skipped rather than merged as zeros.
[[gnu::noinline]] void merge_split(OnlineSoftmax& total, float* total_acc, const OnlineSoftmax& part,
                                   const float* part_acc, int64_t head_dim) {
  if (part.max == -std::numeric_limits<float>::infinity()) return;
  float a = 0, b = 0;
  total.merge(part, &a, &b);
  for (int64_t d = 0; d < head_dim; ++d) total_acc[d] = total_acc[d] * a + part_acc[d] * b;
}

// out = acc / sum (zeros for a row that saw no key).
void finish_row(const OnlineSoftmax& total, const float* acc, int64_t head_dim, float* out) {
  const float inv = total.sum > 0 ? 1.0f / total.sum : 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;
}

HeadSource head_source(const KVRows& k, const KVRows& v, int64_t kv_head, const AttentionShape& s) {
  return {&k,
          &v,
          static_cast<size_t>(kv_head) * k.head_stride,
          static_cast<size_t>(kv_head) * v.head_stride,
          s.head_dim,
          s.score_scale(),
          &attention_vector_ops()};
}

// Prefill: work items are (K/V head, tile of query positions); every query
// head of the group joins the item, so each K/V tile is read once per item.
void flash_prefill(const float* q, int64_t n_q, int64_t pos0, const KVRows& k, const KVRows& v,
                   const AttentionShape& s, float* out) {
  const int64_t tile = query_tile(n_q, s.n_kv_heads, omp_get_max_threads());
  const int64_t n_tiles = (n_q + tile - 1) / tile;
#pragma omp parallel
  {
    FlashScratch scratch;
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < s.n_kv_heads * n_tiles; ++item) {
      const int64_t kvh = item / n_tiles, i0 = (item % n_tiles) * tile;
      flash_query_tile(q, i0, std::min(n_q, i0 + tile), pos0, k, v, kvh, s, scratch, out);
    }
  }
}

// Decode: the keys' fixed splits (kKeySplit) are work items spread over the
// threads, each taking every K/V head of its keys in turn (with head-major
// blocks each head's keys are one contiguous run). Each leaves its rows'
// partial (max, sum, output), and every row then merges its splits in split
// order, as the prefill path does.
void flash_decode(const float* q, int64_t n_q, int64_t pos0, const KVRows& k, const KVRows& v, int64_t n_kv,
                  const AttentionShape& s, float* out) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads, q_stride = s.n_heads * hd;
  const int64_t n_rows = n_q * group;
  const int64_t n_splits = (n_kv + kKeySplit - 1) / kKeySplit;
  const int64_t n_parts = s.n_kv_heads * n_splits;  // (head, split), head-major
  std::vector<OnlineSoftmax> part_state(static_cast<size_t>(n_parts * n_rows));
  std::vector<float> part_acc(static_cast<size_t>(n_parts * n_rows * hd));
  const auto query_row = [&](int64_t kvh, int64_t r) { return q + (r / group) * q_stride + (kvh * group + r % group) * hd; };
  // q8_0 keys: each head's rows quantized once here, not once per split.
  std::vector<QuantizedQueries> head_q8(k.type == KVType::Q8_0 ? static_cast<size_t>(s.n_kv_heads) : 0);
  for (int64_t kvh = 0; kvh < static_cast<int64_t>(head_q8.size()); ++kvh) {
    std::vector<const float*> rows_q(static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) rows_q[static_cast<size_t>(r)] = query_row(kvh, r);
    head_q8[static_cast<size_t>(kvh)].quantize(rows_q.data(), n_rows, hd, s.q8_query_parts);
  }
#pragma omp parallel
  {
    FlashScratch scratch;
    RowBlock& rows = scratch.rows;
#pragma omp for schedule(dynamic)
    for (int64_t split = 0; split < n_splits; ++split) {
      for (int64_t kvh = 0; kvh < s.n_kv_heads; ++kvh) {
        const int64_t part = kvh * n_splits + split;
        reset_rows(rows, n_rows, hd);
        for (int64_t r = 0; r < n_rows; ++r) {
          rows.q[r] = query_row(kvh, r);
          rows.pos[r] = pos0 + r / group;
          rows.first[r] = s.first_key(rows.pos[r]);
        }
        if (!head_q8.empty()) rows.q8 = head_q8[static_cast<size_t>(kvh)].rows.data();
        attend_keys(rows, head_source(k, v, kvh, s), split * kKeySplit, std::min(n_kv, (split + 1) * kKeySplit),
                    scratch.tile);
        std::copy(rows.state.begin(), rows.state.end(), part_state.begin() + part * n_rows);
        std::copy(rows.acc.begin(), rows.acc.end(), part_acc.begin() + part * n_rows * hd);
      }
    }
  }
  std::vector<float> acc(static_cast<size_t>(hd));
  for (int64_t kvh = 0; kvh < s.n_kv_heads; ++kvh) {
    for (int64_t r = 0; r < n_rows; ++r) {
      OnlineSoftmax total;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t split = 0; split < n_splits; ++split) {
        const int64_t at = (kvh * n_splits + split) * n_rows + r;
        merge_split(total, acc.data(), part_state[static_cast<size_t>(at)], part_acc.data() + at * hd, hd);
      }
      finish_row(total, acc.data(), hd, out + (r / group) * q_stride + (kvh * group + r % group) * hd);
    }
  }
}

}  // namespace

namespace flash_detail {

void QuantizedQueries::quantize(const float* const* q, int64_t n, int64_t head_dim, int parts) {
  const int64_t nb = head_dim / kQK8_0;
  values.resize(static_cast<size_t>(n * 2 * head_dim));
  scales.resize(static_cast<size_t>(n * nb));
  sums.resize(static_cast<size_t>(n * 2 * nb));
  rows.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    int8_t* qr = values.data() + r * 2 * head_dim;
    float* d = scales.data() + r * nb;
    int32_t* sum = sums.data() + r * 2 * nb;
    quantize_query_q8(q[r], head_dim, parts, qr, d, sum);
    rows[static_cast<size_t>(r)] = {qr, d, sum, parts};
  }
}

int64_t query_tile(int64_t n_q, int64_t n_kv_heads, int64_t threads) {
  int64_t tile = kMaxQueryTile;
  while (tile > kMinQueryTile && n_kv_heads * ((n_q + tile - 1) / tile) < 4 * threads) tile /= 2;
  return tile;
}

void flash_query_tile(const float* q, int64_t i0, int64_t i1, int64_t pos0, const KVRows& k, const KVRows& v,
                      int64_t kv_head, const AttentionShape& s, FlashScratch& scratch, float* out) {
  const int64_t hd = s.head_dim, group = s.n_heads / s.n_kv_heads, q_stride = s.n_heads * hd;
  RowBlock& rows = scratch.rows;
  reset_rows(rows, (i1 - i0) * group, hd);
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = (i - i0) * group + g;
      rows.q[r] = q + i * q_stride + (kv_head * group + g) * hd;
      rows.pos[r] = pos0 + i;
      rows.first[r] = s.first_key(pos0 + i);
    }
  const HeadSource src = head_source(k, v, kv_head, s);
  if (k.type == KVType::Q8_0) {
    rows.own_q8.quantize(rows.q.data(), rows.n_rows, hd, s.q8_query_parts);
    rows.q8 = rows.own_q8.rows.data();
  }
  const int64_t n_kv = pos0 + i1;
  // Splits wholly before every row's window hold nothing to merge.
  const int64_t first_split = s.first_key(pos0 + i0) / kKeySplit * kKeySplit;
  for (int64_t j0 = first_split; j0 < n_kv; j0 += kKeySplit) {
    if (j0 > first_split) reset_split(rows, hd);
    attend_keys(rows, src, j0, std::min(n_kv, j0 + kKeySplit), scratch.tile);
    for (int64_t r = 0; r < rows.n_rows; ++r)
      merge_split(rows.merged[r], rows.merged_acc.data() + r * hd, rows.state[r], rows.acc.data() + r * hd, hd);
  }
  for (int64_t r = 0; r < rows.n_rows; ++r) {
    const int64_t i = i0 + r / group, h = kv_head * group + r % group;
    finish_row(rows.merged[r], rows.merged_acc.data() + r * hd, hd, out + i * q_stride + h * hd);
  }
}

void validate_attention(const KVRows& k, const KVRows& v, int64_t n_kv, const AttentionShape& s) {
  if (s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw Error("attention: " + std::to_string(s.n_heads) + " query heads cannot share " +
                std::to_string(s.n_kv_heads) + " K/V heads (need a positive whole ratio)");
  require_kv_type_fits(k.type, s.head_dim);
  require_kv_type_fits(v.type, s.head_dim);
  if (n_kv > 0 && (k.block_size <= 0 || v.block_size <= 0 || !k.blocks || !v.blocks))
    throw Error("attention: K/V rows need a positive block size and a block table");
}

}  // namespace flash_detail

float OnlineSoftmax::add(float score) {
  if (score == -std::numeric_limits<float>::infinity()) return 1.0f;
  if (score <= max) {
    sum += std::exp(score - max);
    return 1.0f;
  }
  const float rescale = max == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(max - score);
  sum = sum * rescale + 1.0f;
  max = score;
  return rescale;
}

void OnlineSoftmax::merge(const OnlineSoftmax& other, float* scale_self, float* scale_other) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const float new_max = std::max(max, other.max);
  *scale_self = max == ninf ? 0.0f : std::exp(max - new_max);
  *scale_other = other.max == ninf ? 0.0f : std::exp(other.max - new_max);
  sum = sum * *scale_self + other.sum * *scale_other;
  max = new_max;
}

void online_softmax(const float* x, int64_t n, float* out) {
  OnlineSoftmax st;
  for (int64_t i = 0; i < n; ++i) st.add(x[i]);
  for (int64_t i = 0; i < n; ++i)
    out[i] = st.sum > 0 && x[i] != -std::numeric_limits<float>::infinity() ? std::exp(x[i] - st.max) / st.sum : 0.0f;
}

void flash_attention(const float* q, int64_t n_q, int64_t pos0, const KVRows& k, const KVRows& v, int64_t n_kv,
                     const AttentionShape& shape, float* out) {
  validate_attention(k, v, n_kv, shape);
  const int64_t threads = omp_get_max_threads();
  // Few query rows against a long context: not enough (head, tile) items to
  // keep every thread busy, so split the keys instead.
  const int64_t prefill_items = shape.n_kv_heads * ((n_q + kMinQueryTile - 1) / kMinQueryTile);
  // Either path gives the same bits (fixed key splits merged in order), so
  // this choice, which depends on the threads, is a speed choice only.
  if (n_q <= 4 && prefill_items < threads * 2 && n_kv >= 2 * kKeySplit) {
    flash_decode(q, n_q, pos0, k, v, n_kv, shape, out);
  } else {
    flash_prefill(q, n_q, pos0, k, v, shape, out);
  }
}

void flash_attention(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                     int64_t kv_stride, const AttentionShape& shape, float* out) {
  const auto* k_base = reinterpret_cast<const uint8_t*>(k);
  const auto* v_base = reinterpret_cast<const uint8_t*>(v);
  const size_t stride = static_cast<size_t>(kv_stride) * sizeof(float);
  const int64_t one_block = std::max<int64_t>(n_kv, 1);
  const size_t head_stride = static_cast<size_t>(shape.head_dim) * sizeof(float);  // token-major rows
  const KVRows k_rows{KVType::F32, one_block, stride, &k_base, head_stride};
  const KVRows v_rows{KVType::F32, one_block, stride, &v_base, head_stride};
  flash_attention(q, n_q, pos0, k_rows, v_rows, n_kv, shape, out);
}

}  // namespace kvserve
