#pragma once
// A loaded model: its config and weights. Weight matrices are views into the
// memory-mapped GGUF file (no copies); the small 1-D tensors (norms, biases)
// are converted to f32 once. Const after load and thread-compatible.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "core/tensor.h"
#include "kernels/dispatch.h"
#include "model/config.h"
#include "model/gguf.h"

namespace kvserve {

// One expert of a mixture-of-experts block: a gated FFN of expert_ffn_dim,
// views of its slice of the block's stacked [n_experts][rows][cols] tensors.
struct ExpertWeights {
  TensorView gate;  // [expert_ffn_dim, dim]
  TensorView up;    // [expert_ffn_dim, dim]
  TensorView down;  // [dim, expert_ffn_dim]
};

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  TensorView wq;                 // [q_dim rows, dim cols]
  TensorView wk;                 // [kv_dim, dim]
  TensorView wv;                 // [kv_dim, dim]
  TensorView wo;                 // [dim, q_dim]
  std::vector<float> bq, bk, bv; // [q_dim], [kv_dim], [kv_dim]; empty when absent
  std::vector<float> q_norm, k_norm;  // [head_dim] RMSNorm of each Q / K head before RoPE (qwen3); empty when absent
  std::vector<float> attn_post_norm;  // [dim] RMSNorm of the attention output before the residual add (gemma3); empty when absent
  std::vector<float> ffn_norm;   // [dim]
  std::vector<float> ffn_post_norm;   // [dim] same for the FFN output (gemma3)
  TensorView w_gate;             // [ffn_dim, dim]
  TensorView w_up;               // [ffn_dim, dim]
  TensorView w_down;             // [dim, ffn_dim]
  // A mixture-of-experts block (config.is_moe_block()): the dense w_gate /
  // w_up / w_down are absent; the router picks experts, and qwen2moe and
  // deepseek add a shared FFN (the shared_* views), qwen2moe's scaled by
  // sigmoid(shared_gate_inp . x).
  TensorView router;                  // [n_experts, dim] (ffn_gate_inp)
  std::vector<ExpertWeights> experts;  // [n_experts]
  TensorView shared_gate, shared_up, shared_down;  // [shared_ffn, dim] x 2, [dim, shared_ffn]
  std::vector<float> shared_gate_inp;  // [dim]
  std::vector<float> expert_bias;      // [n_experts] exp_probs_b: added to the router's scores for the choice only (V3)
  // Multi-head latent attention (config.is_mla()): wq is [n_heads * mla_key_dim, dim]
  // or, with q_lora_rank, wq_a then q_a_norm then wq_b; wk / wv are absent.
  TensorView wq_a;                     // [q_lora_rank, dim]
  std::vector<float> q_a_norm;         // [q_lora_rank]
  TensorView wq_b;                     // [n_heads * mla_key_dim, q_lora_rank]
  TensorView wkv_a;                    // [kv_lora_rank + rope_dims, dim] (attn_kv_a_mqa): latent + RoPE key
  std::vector<float> kv_a_norm;        // [kv_lora_rank]
  std::vector<TensorView> wk_b;        // [n_heads] of [kv_lora_rank, qk_nope_dim]: absorbs a head's q_nope
  std::vector<TensorView> wv_b;        // [n_heads] of [v_head_dim, kv_lora_rank]: a head's latent output to values

  // Every weight matrix of the block (the non-empty ones), for repacking and byte counts.
  std::vector<TensorView*> matrices();
  std::vector<const TensorView*> matrices() const;
};

struct ModelWeights {
  TensorView token_embd;         // [vocab rows, dim cols]
  std::vector<float> output_norm;  // [dim]
  TensorView output;             // [vocab, dim]; the token embedding when tied
  bool tied_output = false;
  std::vector<LayerWeights> layers;
};

// RoPE scaling that replaces the file's (kvserve's --rope-scaling, --rope-scale,
// --yarn-orig-ctx, as llama.cpp's flags): ModelConfig::override_rope_scaling.
struct RopeScalingOverride {
  std::string type;  // "none", "linear" or "yarn"
  double factor = 1.0;
  int64_t original_context = 0;  // yarn: 0 is the file's original (or trained) context
};

struct ModelLoadOptions {
  // Use only the first max_layers transformer blocks (then the final norm and
  // output head, as usual): a cheap, vocabulary-compatible draft model for
  // speculative decoding made from the target's own file, with no weight
  // copies. 0 keeps every block; more than the file has is an error.
  int64_t max_layers = 0;
  // Compute logits only for token ids below this (the output head's first
  // rows); the others get -inf, so they are never sampled. A cheaper draft
  // head for speculative decoding: byte-level BPE vocabularies number their
  // tokens in merge order, so low ids are the frequent ones. Any proposal
  // distribution keeps the rejection rule exact. 0 keeps every row.
  int64_t max_output_rows = 0;
  // This model's matmuls use these activations whatever the process default
  // (kernels/dispatch.h): drafts take q8, faster and harmless to the output.
  std::optional<ActivationPrecision> activations = std::nullopt;
  // Repack the matrices for the 8-bit-activation kernels (kernels/repack.h)
  // when this model runs with q8 activations and the CPU has those kernels,
  // and float matrices for the float GEMM (kernels/float_packed.h) whenever
  // the CPU has it.
  bool repack = true;
  // This process's stage of a pipeline of pipeline_ranks processes
  // (src/parallel/, docs/scaling.md): rank r holds the file's blocks
  // [r * L / ranks, (r + 1) * L / ranks) and the model then looks like one of
  // that many layers to everything downstream (KV caches size themselves from
  // n_layers). Only those blocks are mapped and repacked; the token embedding
  // is loaded by rank 0 only, the final norm and output head by the last rank
  // only (a tied head is the embedding, so that rank maps it too). Not
  // combined with max_layers.
  int pipeline_rank = 0;
  int pipeline_ranks = 1;
  std::optional<RopeScalingOverride> rope_scaling = std::nullopt;
};

// The file's transformer blocks a Model holds: [first, end) of total.
struct LayerRange {
  int64_t first = 0;
  int64_t end = 0;
  int64_t total = 0;
};

class Model {
 public:
  // Throws kvserve::Error naming the file and the offending tensor or key.
  static std::unique_ptr<Model> load(const std::string& path, const ModelLoadOptions& options = {});

  const GGUFFile& file() const { return *file_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // The activation precision its passes use; empty: the process default.
  std::optional<ActivationPrecision> activations() const { return activations_; }
  // Bytes of weights read to decode one token (every matrix once; of a
  // mixture of experts, the used experts' share of the expert matrices).
  size_t weight_bytes_per_token() const;
  // The file's blocks this model runs (a pipeline stage holds a slice).
  const LayerRange& layer_range() const { return layer_range_; }
  // Whether it holds the token embedding (it is a pipeline's first stage or
  // the whole model) and the final norm + output head (the last stage).
  bool embeds_tokens() const { return layer_range_.first == 0; }
  bool has_output_head() const { return layer_range_.end == layer_range_.total; }
  // Weight bytes this process holds once every tensor it uses was read: its
  // matrices (repacked copies where repacked, else the mapped bytes), the
  // embedding and head when held (once when tied), norms and biases as f32.
  // The embedding counts whole, although a step reads only its tokens' rows.
  size_t resident_weight_bytes() const;
  // After the embedding row of `id` was read: where the head is a repacked
  // copy of a tied embedding, the mapped embedding serves only these lookups,
  // and its pages are dropped again (they return from the page cache on the
  // next lookup), so that a long prompt's distinct tokens do not pile the
  // original table up in memory beside its copy. No-op otherwise.
  void release_embedding_row(int32_t id) const;

 private:
  std::unique_ptr<GGUFFile> file_;
  ModelConfig config_;
  ModelWeights weights_;
  LayerRange layer_range_;
  std::optional<ActivationPrecision> activations_;
  std::vector<AlignedBuffer<uint8_t>> packed_;
  std::vector<AlignedBuffer<uint8_t>> derived_;  // matrices computed at load (an older deepseek2 file's W_UK^T)
  bool release_embedding_pages_ = false;  // see release_embedding_rows()

  // quantized: the packable quantized types; floats: f32 / f16 / bf16.
  void repack_matrices(bool quantized, bool floats);
};

}  // namespace kvserve
