#pragma once
// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rope.h"

namespace kvserve {

class GGUFFile;
struct KVModelShape;
struct KVShape;

struct ModelConfig {
  std::string arch;        // "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3", "qwen2moe", "qwen3moe", "deepseek", "deepseek2"
  std::string name;        // general.name, for display
  int64_t n_layers = 0;
  int64_t dim = 0;         // embedding / residual width
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // K/V heads (GQA when < n_heads)
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  int64_t rope_dims = 0;   // leading dims of each head that RoPE rotates
  int64_t file_context_length = 0;  // context_length as the file says it, before any scaling extends it
  float rope_theta = 10000.0f;
  bool rope_neox = false;  // pairs (i, i + d/2) instead of (2i, 2i + 1)
  // RoPE scaling that changes frequencies (kernels/rope.h): Llama 3's
  // per-pair divisors (tensor rope_freqs.weight) and linear position scaling
  // (rope.scaling.type linear). Other schemes are refused at load.
  std::vector<float> rope_freq_factors;
  double rope_position_scale = 1.0;
  RopeYarn rope_yarn;             // rope.scaling.type yarn (ext_factor 0 otherwise)
  double rope_magnitude = 1.0;    // YaRN's mscale times rope.scaling.attn_factor
  double rope_attn_factor = 1.0;  // rope.scaling.attn_factor alone
  float norm_eps = 1e-5f;
  // Gemma 3: interleaved sliding-window layers. A sliding layer's query at
  // position p sees keys p - sliding_window < j <= p and rotates with its own
  // RoPE base; the other layers are global (every key, rope_theta).
  int64_t sliding_window = 0;             // 0: no sliding layers
  std::vector<bool> layer_is_sliding;     // [n_layers] when sliding_window > 0
  float rope_theta_sliding = 10000.0f;
  float embedding_scale = 1.0f;           // token embeddings are multiplied by this (Gemma: sqrt(dim))
  enum class FfnActivation { kSilu, kGeluTanh };
  FfnActivation ffn_activation = FfnActivation::kSilu;  // of the gate, times up
  float final_logit_softcap = 0.0f;       // > 0: logits = cap * tanh(logits / cap)
  float attention_scale = 0.0f;           // 0: 1 / sqrt(head_dim)
  // Mixture of experts (qwen2moe, qwen3moe, deepseek): every block's FFN (but
  // deepseek's leading dense ones) is n_experts gated FFNs of expert_ffn_dim,
  // of which a router picks n_experts_used per token (softmax, top-k; weights
  // renormalized over the k when expert_weights_norm, then scaled by
  // expert_weights_scale), plus, when shared_expert_ffn_dim > 0, one shared
  // FFN every token runs (behind a sigmoid gate when shared_expert_gated).
  int64_t n_experts = 0;                  // 0: dense FFN
  int64_t n_experts_used = 0;
  int64_t expert_ffn_dim = 0;
  bool expert_weights_norm = false;
  int64_t shared_expert_ffn_dim = 0;
  bool shared_expert_gated = false;        // qwen2moe: sigmoid(ffn_gate_inp_shexp . x); deepseek: ungated
  double expert_weights_scale = 1.0;       // the chosen experts' weights times this (deepseek)
  int64_t leading_dense_blocks = 0;        // the first blocks keep a dense FFN (deepseek)
  // deepseek2's router (DeepSeek-V3): sigmoid instead of softmax, a per-expert
  // bias added for the choice only (exp_probs_b), and the experts in groups of
  // which only the best expert_groups_used (by the sum of each group's top two)
  // may be chosen.
  bool expert_gating_sigmoid = false;
  int64_t expert_groups = 0;       // 0 or 1: no groups
  int64_t expert_groups_used = 0;
  // Multi-head latent attention (deepseek2, kv_lora_rank > 0). The cache holds
  // per token and layer one row of kv_lora_rank + rope_dims values: the
  // normalized latent c and the RoPE key. Queries are absorbed into the latent
  // space (per head: q_nope W_UK^T), so attention is MQA over those rows with
  // head_dim = kv_lora_rank + rope_dims and n_kv_heads = 1, V being the rows'
  // first kv_lora_rank values; each head's output goes through W_UV to
  // v_head_dim values. mla_key_dim = qk_nope_dim + rope_dims sets the score
  // scale, as in the decompressed form.
  int64_t q_lora_rank = 0;   // 0: a plain attn_q (the Lite models)
  int64_t kv_lora_rank = 0;  // 0: not MLA
  int64_t qk_nope_dim = 0;   // per head: the query/key part without RoPE
  int64_t v_head_dim = 0;    // per head: the decompressed value width
  bool mla_fused_kv_b = false;  // the older layout: attn_kv_b holds every head's W_UK and W_UV rows
  double mla_yarn_log_mul = 0;  // rope.scaling.yarn_log_multiplier / 0.1 (llama.cpp's deepseek2 reading)

  RopeParams rope_params() const {
    return {rope_dims, rope_theta, rope_neox, rope_freq_factors, rope_position_scale, rope_yarn, rope_magnitude};
  }
  RopeParams sliding_rope_params() const {
    return {rope_dims, rope_theta_sliding, rope_neox, rope_freq_factors, rope_position_scale, rope_yarn, rope_magnitude};
  }
  bool is_sliding(int64_t layer) const {
    return sliding_window > 0 && layer_is_sliding[static_cast<size_t>(layer)];
  }
  // Keys a query of `layer` sees behind itself, itself included; 0: all.
  int64_t attention_window(int64_t layer) const { return is_sliding(layer) ? sliding_window : 0; }
  bool is_moe() const { return n_experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  // MLA: one projected query head before absorption (nope + rope values).
  int64_t mla_key_dim() const { return qk_nope_dim + rope_dims; }
  // Whether the file's block `file_layer` has experts (a MoE model's leading blocks may be dense).
  bool is_moe_block(int64_t file_layer) const { return is_moe() && file_layer >= leading_dense_blocks; }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t group_size() const { return n_heads / n_kv_heads; }
  // K and V bytes per token across all layers for a cache element of `elem_bytes`.
  // MLA stores only the latent row (V is a view of it).
  int64_t kv_bytes_per_token(double elem_bytes = 4.0) const {
    return static_cast<int64_t>((is_mla() ? 1.0 : 2.0) * static_cast<double>(n_layers * kv_dim()) * elem_bytes);
  }

  // What the K/V cache holds per layer and token (kv/kv_shape.h), for kv/ to size and store it.
  KVShape kv_shape() const;

  // Throws kvserve::Error for an unsupported architecture or inconsistent values.
  static ModelConfig from_gguf(const GGUFFile& file);

  // Replaces the file's RoPE scaling (llama.cpp's --rope-scaling / --rope-scale /
  // --yarn-orig-ctx): type "none", "linear" or "yarn"; original_context 0: the
  // file's context. Throws kvserve::Error for another type or a bad value.
  void override_rope_scaling(const std::string& type, double factor, int64_t original_context);
  // MLA: the score scale (and, with YaRN, RoPE's magnitude) as llama.cpp's deepseek2 graph sets them.
  void set_mla_scales();
};

// The model as `kvserve kv-size` plans its cache (kv/kv_planner.h), with its name and query heads.
KVModelShape kv_shape_from_config(const ModelConfig& config);

}  // namespace kvserve
