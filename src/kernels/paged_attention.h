#pragma once
// Causal GQA attention for a batch of sequences whose K/V rows live in
// fixed-size blocks of the paged KV cache, in any KV element type. Each
// sequence is one job whose KVRows carry its block table; the tile loop is
// flash attention's own (kernels/flash_attention_tile.h), so quantized rows
// are dequantized one key tile at a time and the score matrix is never
// materialized. Work items are (job, K/V head, tile of query rows), spread
// over the OpenMP threads: a step of many single-token decodes keeps every
// thread busy. A batch of one job is flash_attention itself (which splits a
// long decode's keys over the threads): a job's output is the same bits alone
// or in any batch (fixed key splits, kernels/flash_attention_tile.h).
#include <cstdint>
#include <span>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"

namespace kvserve {

struct PagedAttentionJob {
  const float* q = nullptr;  // [n_q][n_heads * head_dim]; query i sits at position pos0 + i
  int64_t n_q = 0;
  int64_t pos0 = 0;          // query i attends to keys 0..pos0+i
  KVRows k;                  // rows 0 .. pos0 + n_q - 1 through the sequence's block table
  KVRows v;
  float* out = nullptr;      // [n_q][n_heads * head_dim]
};

// Throws kvserve::Error like flash_attention (head counts, KV type vs head size).
void paged_attention(std::span<const PagedAttentionJob> jobs, const AttentionShape& shape);

}  // namespace kvserve
