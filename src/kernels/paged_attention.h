#pragma once
// Causal GQA attention for a batch of sequences whose K/V rows live in
// fixed-size blocks (the paged KV cache). Each sequence is one job; the tile
// loop walks the sequence's block table instead of a contiguous array, with
// the online softmax of flash attention (kernels/flash_attention.h), so the
// score matrix is never materialized. Work items are (job, K/V head, tile of
// query rows), spread over the OpenMP threads: a step of many single-token
// decodes keeps every thread busy.
#include <cstdint>
#include <span>

#include "kernels/attention.h"

namespace kvserve {

struct PagedAttentionJob {
  const float* q = nullptr;               // [n_q][n_heads * head_dim]; query i sits at position pos0 + i
  int64_t n_q = 0;
  int64_t pos0 = 0;                       // query i attends to keys 0..pos0+i
  const float* const* k_blocks = nullptr; // [>= (pos0 + n_q + B - 1) / B] -> [B][kv_stride] K rows
  const float* const* v_blocks = nullptr; // same shape, V rows
  float* out = nullptr;                   // [n_q][n_heads * head_dim]
};

// B = block_size; row r of a block at block + r * kv_stride ([n_kv_heads * head_dim] used).
void paged_attention(std::span<const PagedAttentionJob> jobs, int64_t block_size, int64_t kv_stride,
                     const AttentionShape& shape);

}  // namespace kvserve
