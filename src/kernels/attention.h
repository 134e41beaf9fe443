#pragma once
// Causal multi-head attention with grouped K/V heads (GQA).
#include <cstdint>

namespace kvserve {

struct AttentionShape {
  int64_t n_heads;     // query heads
  int64_t n_kv_heads;  // K/V heads; query head h reads K/V head h / (n_heads / n_kv_heads)
  int64_t head_dim;
  // Sliding window (Gemma 3's local layers): a query at position p sees keys
  // p - window < j <= p. 0: every key up to p.
  int64_t window = 0;
  float scale = 0.0f;  // of q.k; 0: 1 / sqrt(head_dim)
  // Parts of a query scored against q8_0 keys (kv_quant.h's QueryQ8): 2 (~15
  // bits), or 1 (8 bits) where the keys are stored Hadamard-rotated, whose
  // rounding then dominates (the model's choice; docs/attention.md).
  int q8_query_parts = 2;

  float score_scale() const;
  // The first key a query at `pos` sees.
  int64_t first_key(int64_t pos) const { return window > 0 && pos >= window ? pos - window + 1 : 0; }
};

// q:   [n_q][n_heads * head_dim], query i sits at position pos0 + i.
// k,v: key/value rows for positions 0..n_kv-1, row p at k + p * kv_stride
//      ([n_kv_heads * head_dim] used). Query i attends to keys
//      shape.first_key(pos0 + i) .. pos0 + i.
// out: [n_q][n_heads * head_dim].
// The plain materializing algorithm: each head's [n_q x n_kv] score matrix
// is written to a buffer, soft-maxed row by row, then multiplied by V.
void attention_reference(const float* q, int64_t n_q, int64_t pos0, const float* k, const float* v, int64_t n_kv,
                         int64_t kv_stride, const AttentionShape& shape, float* out);

}  // namespace kvserve
