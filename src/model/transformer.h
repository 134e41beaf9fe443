#pragma once
// The transformer forward pass over a batch of consecutive tokens of one
// sequence: embeddings -> n_layers x (attention, gated FFN) -> norm -> logits.
// Holds the per-step activations (scratch), not the weights (Model) nor the
// KV memory (the cache passed in). Not thread-safe: one Transformer per
// concurrent caller; the kernels inside use all OpenMP threads.
#include <cstdint>
#include <span>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/attention.h"
#include "kernels/hadamard.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "kv/contiguous_kv_cache.h"
#include "kv/paged_kv_storage.h"
#include "model/expert_routing.h"
#include "model/model.h"

namespace kvserve {

// One sequence's share of a batched step (forward_batch): its tokens at
// positions [pos0, pos0 + n), whose K/V rows go to the blocks its page table
// names; attention reads positions [0, pos0 + n) through the same table.
struct SequenceChunk {
  std::span<const int32_t> tokens;
  int64_t pos0 = 0;
  std::span<const BlockId> block_table;  // covers at least pos0 + n positions
  bool want_logits = false;              // the last token's logits are needed
  int64_t logits_rows = 1;               // with want_logits: logits of the last logits_rows tokens (speculative verification)
  // The sliding layers' table when the storage has a sliding group (same
  // coverage; kNoBlock before the window of pos0); empty otherwise.
  std::span<const BlockId> sliding_block_table = {};
};

// Which attention kernel the forward pass runs.
enum class AttentionKernel {
  kReference,  // materializes every head's score matrix (kernels/attention.h)
  kFlash,      // tiled, online softmax (kernels/flash_attention.h)
};

class Transformer {
 public:
  Transformer(const Model& model, AttentionKernel attention);

  // Runs `tokens` at positions [cache.size(), cache.size() + n): appends their
  // K/V rows to `cache` and writes logits: the last token's [vocab], or with
  // all_logits every token's [n][vocab] (speculative verification, perplexity).
  // Throws kvserve::Error for a token id outside the vocabulary or a batch
  // that does not fit in the cache.
  void forward(std::span<const int32_t> tokens, ContiguousKVCache& cache, float* logits, bool all_logits = false);

  // Continuous batching: every chunk's tokens go through the weights together
  // (one [sum of n][dim] activation matrix, so each weight is read once per
  // step); attention runs per sequence through its page table in `kv`.
  // Writes logits_rows [vocab] rows of logits per chunk with want_logits, in
  // chunk and token order, to logits ([rows wanted][vocab]). Defined in transformer_batch.cpp.
  void forward_batch(std::span<const SequenceChunk> chunks, PagedKVStorage& kv, float* logits);

  // One pipeline stage's share of forward_batch (src/parallel/): the model's
  // layers (a stage's slice, ModelLoadOptions::pipeline_rank) over the
  // residual stream x_in ([n][dim], what the previous stage sent; null: the
  // tokens' embeddings), then either logits as forward_batch (x_out null: the
  // last stage) or the residual stream after its layers into x_out ([n][dim],
  // for the next stage). Chunks are checked (logits_rows included) before
  // anything runs. Throws kvserve::Error when the model lacks the embedding or
  // head that this call needs.
  void forward_stage(std::span<const SequenceChunk> chunks, PagedKVStorage& kv, const float* x_in, float* x_out,
                     float* logits);

  // MLA only: run attention in the decompressed form (each head's K and V
  // rebuilt from the latent rows every step) instead of the absorbed one, in
  // forward(); the reference of tests and benchmarks (KVSERVE_MLA=decompressed
  // sets it too). forward_batch always runs the absorbed form.
  void set_mla_decompressed(bool on) { mla_decompressed_ = on; }

  // Query rows that went through attention since construction (all layers
  // count once per token): the naive decoder's N(N+1)/2 vs the cached N.
  int64_t attention_rows() const { return attention_rows_; }
  // Wall seconds spent in the attention kernels (after the K/V writes) since
  // construction: with the K/V bytes they read, `kvserve bench`'s attention
  // read rate (two clock reads per layer and step).
  double attention_seconds() const { return attention_seconds_; }
  int64_t vocab_size() const { return cfg_.vocab_size; }

 private:
  void resize_scratch(int64_t n);
  void embed(std::span<const int32_t> tokens);
  // cos / sin of every batch row's position into rope_angles_ (row t at t * rot_dims).
  void prepare_rope(std::span<const int64_t> positions);
  void rotate_qk(int64_t t, int64_t layer);
  // kv_rotation_ for a cache of `type` (none when KVSERVE_KV_ROTATION=0).
  void choose_kv_rotation(KVType type);
  // Row t's query, key and value turned by kv_rotation_ before the cache stores them (kernels/hadamard.h).
  void rotate_for_cache(int64_t t);
  // attn_'s n rows turned back from the values' rotation (each head's values; MLA: their kv_lora_rank).
  void unrotate_attention_output(int64_t n);
  AttentionShape attention_shape(int64_t layer) const;
  // x_ += proj_ of n rows, through the block's post-norm when it has one (gemma3).
  void add_residual(const std::vector<float>& post_norm, int64_t n);
  // xn_ = rmsnorm(x_) of n rows, then q_, k_, v_ = its Q/K/V projections (+ biases),
  // in one shared-input matmul region; both forward paths use it.
  void project_qkv(const LayerWeights& w, int64_t n);
  // project_qkv, or MLA's projections (mla_attention.cpp): q_ holds the
  // absorbed queries and k_ the cache rows, both already rotated.
  void project_attention(const LayerWeights& w, int64_t n);
  // proj_ = attn_output of the attention's result (MLA: each head through W_UV
  // first, unless values_ready: attend_decompressed wrote mla_v_).
  void attention_output(const LayerWeights& w, int64_t n, bool values_ready = false);
  void resize_mla_scratch(int64_t n);
  void project_mla(const LayerWeights& w, int64_t n);
  // out's rows of head h = w[h] x in's rows of head h, all heads in one parallel region (row t of head h
  // at in + t * in_row + h * in_head, w[h].cols() values; out likewise, w[h].rows() values).
  void per_head_products(const std::vector<TensorView>& w, const float* in, int64_t in_row, int64_t in_head,
                         int64_t n, float* out, int64_t out_row, int64_t out_head);
  void absorb_queries(const LayerWeights& w, int64_t n);
  void mla_values(const LayerWeights& w, int64_t n);
  void attend_decompressed(int64_t layer, int64_t n, int64_t pos0, const ContiguousKVCache& cache);
  void attention_block(int64_t layer, int64_t n, ContiguousKVCache& cache);
  void attend(int64_t layer, int64_t n, int64_t pos0, const ContiguousKVCache& cache);
  void ffn_block(int64_t layer, int64_t n);
  // A mixture-of-experts block's FFN (moe_ffn.cpp); ffn_block calls it for MoE models.
  void moe_ffn_block(int64_t layer, int64_t n);
  // out = down(silu(gate x) * up x) of m rows of x ([m][dim]), through gate_ / up_.
  void run_expert(const ExpertWeights& e, const float* x, int64_t m, float* out);
  // Every expert with rows in groups_ over its slots of expert_x_ into expert_y_.
  void run_experts(const LayerWeights& w);
  // Logits of xn_'s first n_rows rows, [n_rows][vocab] (see max_output_rows).
  void output_logits(int64_t n_rows, float* logits);
  // Concatenates the chunks' tokens into batch_tokens_, their positions and
  // K/V blocks into positions_ and row_blocks_, after checking each chunk.
  void gather_batch(std::span<const SequenceChunk> chunks, const PagedKVStorage& kv);
  // xn_ = the final norm of the rows whose logits are wanted; returns their count.
  int64_t normalize_output_rows(std::span<const SequenceChunk> chunks);
  void paged_attention_block(int64_t layer, std::span<const SequenceChunk> chunks, PagedKVStorage& kv);

  const Model& model_;
  const ModelConfig& cfg_;
  AttentionKernel attention_;
  // Mixture of experts: a step's rows grouped by expert (each expert's weights
  // read once per step); KVSERVE_MOE_GROUPING=0 runs each token's experts
  // alone instead, the baseline of the grouping benchmark (docs/moe_mla.md).
  bool group_experts_ = true;
  bool mla_decompressed_ = false;
  bool mla_decompressed_decode_ = false;
  // Quantized K/V are stored Hadamard-rotated (kernels/hadamard.h); KVSERVE_KV_ROTATION=0 stores them as
  // they come, the baseline of docs/attention.md's "Rotated quantized K/V".
  bool kv_rotation_enabled_ = true;
  KVRotation kv_rotation_;  // the current layer's cache's
  RopeTable rope_;
  RopeTable sliding_rope_;  // the sliding-window layers' own base (gemma3); unused without them
  int64_t capacity_ = 0;
  int64_t attention_rows_ = 0;
  double attention_seconds_ = 0;
  AlignedBuffer<float> x_;     // [n][dim] residual stream
  AlignedBuffer<float> xn_;    // [n][dim] normalized input of a block
  AlignedBuffer<float> q_;     // [n][q_dim]
  AlignedBuffer<float> k_;     // [n][kv_dim]
  AlignedBuffer<float> v_;     // [n][kv_dim]
  AlignedBuffer<float> attn_;  // [n][q_dim] attention output before wo
  AlignedBuffer<float> gate_;  // [n][ffn_dim], or of a MoE [n][used x expert width] (or the shared expert's, if wider)
  AlignedBuffer<float> up_;    // same
  AlignedBuffer<float> proj_;  // [n][dim] output of wo / w_down
  // Mixture of experts only: the step's rows gathered by expert (slot s: the
  // s-th of the expert-major order), and the experts' outputs in the same slots.
  AlignedBuffer<float> expert_x_;  // [n * n_experts_used][dim]
  AlignedBuffer<float> expert_y_;  // [n * n_experts_used][dim]
  std::vector<MatmulTask> expert_tasks_;
  std::vector<int64_t> row_slots_;       // [n][n_experts_used] each row's slots, in expert-id order
  std::vector<int64_t> row_slot_counts_;  // [n] filling row_slots_
  std::vector<float> router_logits_;   // [n][n_experts]
  std::vector<ExpertChoice> choices_;  // [n][n_experts_used]
  ExpertGroups groups_;
  std::vector<float> rope_angles_;  // [n][rot_dims] cos / sin pairs of each row's position, for every layer
  std::vector<float> sliding_rope_angles_;  // same with sliding_rope_, when the model has sliding layers
  std::vector<int64_t> positions_;  // [n] each row's position
  std::vector<BlockId> row_blocks_;  // forward_batch: [n] the KV block each row's K/V goes to
  std::vector<BlockId> sliding_row_blocks_;  // forward_batch: [n] same in the sliding group, when the storage has one
  // forward_batch only:
  std::vector<int32_t> batch_tokens_;         // [n] every chunk's tokens, concatenated
  std::vector<const uint8_t*> k_block_ptrs_;  // [sum of chunk table sizes] K block base of the current layer
  std::vector<const uint8_t*> v_block_ptrs_;  // same, V
  // MLA only (mla_attention.cpp): the projected queries [n][n_heads][nope + rope],
  // the low-rank query [n][q_lora_rank], per-head staging [n_heads][n][widest],
  // and the heads' values [n][n_heads * v_head_dim] (attn_output's input).
  AlignedBuffer<float> mla_q_, mla_qa_, mla_in_, mla_out_, mla_v_;
  std::vector<MatmulTask> mla_tasks_;
  std::vector<float> reference_k_, reference_v_;  // [n_kv][kv_dim] a quantized cache as f32, reference kernel only
};

}  // namespace kvserve
