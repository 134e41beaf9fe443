#pragma once
// Flash attention: tiled causal attention with the online softmax. Splits the
// queries into row tiles and the keys into column tiles, keeps a running max
// m, running sum l and an unnormalized output O per query row, rescales when
// the max grows, and divides once at the end. The [n_q x n_kv] score matrix
// is never materialized; tiles fully above the causal diagonal are skipped.
// One pass over each K/V head serves all query heads that share it (GQA).
// For decode (few query rows, long context) the keys are split across
// threads and the partial (m, l, O) triples are merged exactly
// (flash-decoding).
#include <cstdint>
#include <limits>

#include "kernels/attention.h"

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

// Same contract as attention_reference (kernels/attention.h).
void flash_attention(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                     int64_t kv_stride, const AttentionShape& shape, float* out);

}  // namespace kvserve
