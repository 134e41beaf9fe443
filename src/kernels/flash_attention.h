#pragma once
// Flash attention: tiled causal attention with the online softmax. Splits the
// queries into row tiles and the keys into column tiles, keeps a running max
// m, running sum l and an unnormalized output O per query row, rescales when
// the max grows, and divides once at the end. The [n_q x n_kv] score matrix
// is never materialized; tiles fully above the causal diagonal are skipped.
// One pass over each K/V head serves all query heads that share it (GQA).
// For decode (few query rows, long context) the keys are split across
// threads and the partial (m, l, O) triples are merged exactly
// (flash-decoding). Batch invariance: the keys of every row, in every path,
// go in splits of 256 at fixed positions whose partial states are merged in
// split order, so a row's output is the same bits whatever the number of
// query rows in the call, pos0, the threads or the path taken.
//
// K and V are read through KVRows (kernels/kv_quant.h): any KV storage type,
// contiguous or in blocks of a block table. Quantized rows are dequantized one
// key tile at a time into a small per-thread buffer, never as a whole copy.
#include <cstdint>
#include <limits>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"

namespace kvserve {

// Running state of a softmax over a stream of scores.
struct OnlineSoftmax {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0;  // sum of exp(score - max)

  // Adds one score; returns the factor by which earlier exp() terms (and any
  // output accumulated with them) must be rescaled.
  float add(float score);
  // Folds another partial state in; returns {scale for this, scale for other}.
  void merge(const OnlineSoftmax& other, float* scale_self, float* scale_other);
};

// Softmax of x[0..n) computed with OnlineSoftmax in one pass plus the final
// normalization; -inf entries give 0, an all -inf row gives all zeros.
void online_softmax(const float* x, int64_t n, float* out);

// Same contract as attention_reference (kernels/attention.h), with K and V
// rows 0..n_kv-1 read through `k` and `v`. Throws kvserve::Error when a block
// type (q8_0, fp8, q4_0) is asked to hold heads that are not whole 32-element
// blocks, or when the head counts do not divide.
void flash_attention(const float* q, int64_t n_q, int64_t pos0, const KVRows& k, const KVRows& v, int64_t n_kv,
                     const AttentionShape& shape, float* out);

// Contiguous f32 K/V, row p at k + p * kv_stride (attention_reference's layout).
void flash_attention(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                     int64_t kv_stride, const AttentionShape& shape, float* out);

}  // namespace kvserve
