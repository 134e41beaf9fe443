// Transformer::forward_batch: the continuous-batching step over many
// sequences whose K/V live in the paged cache. Kept apart from
// transformer.cpp (the single-sequence path) so that the two evolve
// independently; both share embed(), project_qkv() and ffn_block().
#include <chrono>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/paged_attention.h"
#include "model/transformer.h"

namespace kvserve {

void Transformer::paged_attention_block(int64_t layer, std::span<const SequenceChunk> chunks, PagedKVStorage& kv) {
  const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), B = kv.block_size();
  const auto n = static_cast<int64_t>(batch_tokens_.size());
  const bool mla = cfg_.is_mla();
  project_attention(w, n);
  choose_kv_rotation(kv.type());
  k_block_ptrs_.clear();
  v_block_ptrs_.clear();
  const bool sliding = kv.is_sliding(layer);
  check(!sliding || cfg_.is_sliding(layer), "only a sliding-window layer reads the sliding group's blocks");
  const auto table_of = [sliding](const SequenceChunk& c) { return sliding ? c.sliding_block_table : c.block_table; };
  const std::vector<BlockId>& row_blocks = sliding ? sliding_row_blocks_ : row_blocks_;
  for (const SequenceChunk& c : chunks) kv.append_block_bases(layer, table_of(c), k_block_ptrs_, v_block_ptrs_);
  std::vector<PagedAttentionJob> jobs;
  jobs.reserve(chunks.size());
  // One row each, distinct slots: RoPE and the K/V writes go over the threads.
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = positions_[static_cast<size_t>(t)];
    if (!mla) rotate_qk(t, layer);
    rotate_for_cache(t);
    kv.write(layer, row_blocks[static_cast<size_t>(t)], pos % B, k_.data() + t * kvd,
             mla ? nullptr : v_.data() + t * kvd);
  }
  int64_t row = 0, table_offset = 0;
  for (const SequenceChunk& c : chunks) {
    const auto cn = static_cast<int64_t>(c.tokens.size());
    jobs.push_back({q_.data() + row * qd, cn, c.pos0, kv.k_rows(k_block_ptrs_.data() + table_offset),
                    kv.v_rows(v_block_ptrs_.data() + table_offset), attn_.data() + row * qd});
    row += cn;
    table_offset += static_cast<int64_t>(table_of(c).size());
  }
  const auto start = std::chrono::steady_clock::now();
  paged_attention(jobs, attention_shape(layer));
  attention_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  unrotate_attention_output(n);
  attention_output(w, n);
  add_residual(w.attn_post_norm, n);
}

void Transformer::gather_batch(std::span<const SequenceChunk> chunks, const PagedKVStorage& kv) {
  batch_tokens_.clear();
  positions_.clear();
  row_blocks_.clear();
  sliding_row_blocks_.clear();
  for (const SequenceChunk& c : chunks) {
    const auto cn = static_cast<int64_t>(c.tokens.size());
    if (cn == 0) throw Error("forward_batch: a chunk has no tokens");
    if (c.want_logits && (c.logits_rows < 1 || c.logits_rows > cn))
      throw Error("forward_batch: logits_rows must be in [1, " + std::to_string(cn) + "], got " +
                  std::to_string(c.logits_rows));
    check(static_cast<int64_t>(c.block_table.size()) * kv.block_size() >= c.pos0 + cn, "the page table covers the chunk");
    check(!kv.has_sliding_group() || c.sliding_block_table.size() == c.block_table.size(),
          "the sliding table covers the chunk when the storage has a sliding group");
    batch_tokens_.insert(batch_tokens_.end(), c.tokens.begin(), c.tokens.end());
    for (int64_t pos = c.pos0; pos < c.pos0 + cn; ++pos) {
      const auto logical = static_cast<size_t>(pos / kv.block_size());
      positions_.push_back(pos);
      row_blocks_.push_back(c.block_table[logical]);
      if (kv.has_sliding_group()) sliding_row_blocks_.push_back(c.sliding_block_table[logical]);
    }
  }
  if (batch_tokens_.empty()) throw Error("forward_batch: empty batch");
}

int64_t Transformer::normalize_output_rows(std::span<const SequenceChunk> chunks) {
  int64_t row = 0, n_out = 0;
  for (const SequenceChunk& c : chunks) {
    row += static_cast<int64_t>(c.tokens.size());
    if (!c.want_logits) continue;
    for (int64_t r = row - c.logits_rows; r < row; ++r, ++n_out)
      rmsnorm(x_.data() + r * cfg_.dim, model_.weights().output_norm.data(), cfg_.dim, cfg_.norm_eps,
              xn_.data() + n_out * cfg_.dim);
  }
  return n_out;
}

void Transformer::forward_batch(std::span<const SequenceChunk> chunks, PagedKVStorage& kv, float* logits) {
  forward_stage(chunks, kv, nullptr, nullptr, logits);
}

void Transformer::forward_stage(std::span<const SequenceChunk> chunks, PagedKVStorage& kv, const float* x_in,
                                float* x_out, float* logits) {
  if (x_in == nullptr && !model_.embeds_tokens())
    throw Error("this pipeline stage has no token embedding: it runs from the previous stage's activations");
  if (x_out == nullptr && !model_.has_output_head())
    throw Error("this pipeline stage has no output head: it hands its activations to the next stage");
  if (kv.values_in_keys() != cfg_.is_mla())
    throw Error(std::string("forward_batch: the KV storage ") + (kv.values_in_keys() ? "keeps" : "lacks") +
                " MLA's latent layout, the model " + (cfg_.is_mla() ? "needs it" : "does not"));
  gather_batch(chunks, kv);
  const auto n = static_cast<int64_t>(batch_tokens_.size());
  const auto row_floats = static_cast<size_t>(n * cfg_.dim);
  const ScopedActivationPrecision precision(model_.activations());
  resize_scratch(n);
  if (x_in != nullptr) std::memcpy(x_.data(), x_in, row_floats * sizeof(float));
  else embed(batch_tokens_);
  prepare_rope(positions_);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    paged_attention_block(l, chunks, kv);
    ffn_block(l, n);
  }
  attention_rows_ += n;
  if (x_out != nullptr) {
    std::memcpy(x_out, x_.data(), row_floats * sizeof(float));
    return;
  }
  // Only the rows whose logits are wanted go through the output head.
  const int64_t n_out = normalize_output_rows(chunks);
  if (n_out > 0) output_logits(n_out, logits);
}

}  // namespace kvserve
