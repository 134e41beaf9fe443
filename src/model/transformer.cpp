#include "model/transformer.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"

namespace kvserve {
namespace {

void add_bias(float* rows, int64_t n, const std::vector<float>& bias) {
  if (bias.empty()) return;
  const auto width = static_cast<int64_t>(bias.size());
  for (int64_t t = 0; t < n; ++t) add_inplace(rows + t * width, bias.data(), width);
}

}  // namespace

Transformer::Transformer(const Model& model, AttentionKernel attention)
    : model_(model),
      cfg_(model.config()),
      attention_(attention),
      rope_(model.config().rope_params()),
      sliding_rope_(model.config().sliding_rope_params()) {
  const char* grouping = std::getenv("KVSERVE_MOE_GROUPING");
  group_experts_ = grouping == nullptr || std::string_view(grouping) != "0";
  // KVSERVE_MLA=decompressed: every step in MLA's decompressed form; decompressed-decode: single-token steps only
  // (a long prompt prefilled absorbed, then the decode benchmark's baseline).
  const char* mla = std::getenv("KVSERVE_MLA");
  mla_decompressed_ = mla != nullptr && std::string_view(mla) == "decompressed";
  mla_decompressed_decode_ = mla != nullptr && std::string_view(mla) == "decompressed-decode";
  const char* rotation = std::getenv("KVSERVE_KV_ROTATION");
  kv_rotation_enabled_ = rotation == nullptr || std::string_view(rotation) != "0";
}

void Transformer::prepare_rope(std::span<const int64_t> positions) {
  const int64_t rot = cfg_.rope_dims, n = static_cast<int64_t>(positions.size());
  const bool sliding = cfg_.sliding_window > 0;
  rope_angles_.resize(static_cast<size_t>(n * rot));
  if (sliding) sliding_rope_angles_.resize(static_cast<size_t>(n * rot));
#pragma omp parallel for schedule(static) if (n >= 64)
  for (int64_t t = 0; t < n; ++t) {
    rope_.angles(positions[static_cast<size_t>(t)], rope_angles_.data() + t * rot);
    if (sliding) sliding_rope_.angles(positions[static_cast<size_t>(t)], sliding_rope_angles_.data() + t * rot);
  }
}

void Transformer::rotate_qk(int64_t t, int64_t layer) {
  const float* cs = (cfg_.is_sliding(layer) ? sliding_rope_angles_ : rope_angles_).data() + t * cfg_.rope_dims;
  rope_.apply(q_.data() + t * cfg_.q_dim(), cfg_.n_heads, cfg_.head_dim, cs);
  rope_.apply(k_.data() + t * cfg_.kv_dim(), cfg_.n_kv_heads, cfg_.head_dim, cs);
}

void Transformer::choose_kv_rotation(KVType type) {
  if (!kv_rotation_enabled_) kv_rotation_ = {};
  else if (cfg_.is_mla()) kv_rotation_ = mla_kv_rotation(type, cfg_.kv_dim(), cfg_.kv_lora_rank);
  else kv_rotation_ = kv_rotation(type, cfg_.head_dim);
}

void Transformer::rotate_for_cache(int64_t t) {
  if (kv_rotation_.keys > 0) {
    hadamard_rotate(q_.data() + t * cfg_.q_dim(), cfg_.q_dim(), kv_rotation_.keys);
    hadamard_rotate(k_.data() + t * cfg_.kv_dim(), cfg_.kv_dim(), kv_rotation_.keys);
  }
  if (kv_rotation_.values > 0 && !cfg_.is_mla())
    hadamard_rotate(v_.data() + t * cfg_.kv_dim(), cfg_.kv_dim(), kv_rotation_.values);
}

void Transformer::unrotate_attention_output(int64_t n) {
  if (kv_rotation_.values == 0) return;
  const int64_t qd = cfg_.q_dim(), hd = cfg_.head_dim, width = cfg_.is_mla() ? cfg_.kv_lora_rank : hd;
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < cfg_.n_heads; ++h)
      hadamard_rotate(attn_.data() + t * qd + h * hd, width, kv_rotation_.values);
}

AttentionShape Transformer::attention_shape(int64_t layer) const {
  // Rotated q8_0 keys leave the query's second 8-bit part little to add (Qwen2.5-Coder-0.5B at 4K: KL from f16
  // 0.009299 without it, 0.009351 with; docs/attention.md). MLA's latent keys keep both: not measured there.
  // kv_rotation_ is this layer's: both attention blocks call choose_kv_rotation before this.
  const int q8_parts = kv_rotation_.keys > 0 && !cfg_.is_mla() ? 1 : 2;
  return {cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.attention_window(layer), cfg_.attention_scale, q8_parts};
}

void Transformer::add_residual(const std::vector<float>& post_norm, int64_t n) {
  if (!post_norm.empty()) rmsnorm_rows(proj_.data(), post_norm.data(), n, cfg_.dim, cfg_.norm_eps, proj_.data());
  add_inplace(x_.data(), proj_.data(), n * cfg_.dim);
}

void Transformer::resize_scratch(int64_t n) {
  if (n <= capacity_) return;
  capacity_ = n;
  const auto N = static_cast<size_t>(n);
  x_.resize(N * cfg_.dim);
  xn_.resize(N * cfg_.dim);
  q_.resize(N * cfg_.q_dim());
  k_.resize(N * cfg_.kv_dim());
  v_.resize(N * cfg_.kv_dim());
  attn_.resize(N * cfg_.q_dim());
  // A mixture of experts' gate / up hold every routed row (n x used) or the shared expert's n rows.
  // (and a dense leading block's ffn_dim).
  const int64_t ffn_width =
      cfg_.is_moe()
          ? std::max({cfg_.n_experts_used * cfg_.expert_ffn_dim, cfg_.shared_expert_ffn_dim,
                      cfg_.leading_dense_blocks > 0 ? cfg_.ffn_dim : int64_t{0}})
          : cfg_.ffn_dim;
  gate_.resize(N * ffn_width);
  up_.resize(N * ffn_width);
  proj_.resize(N * cfg_.dim);
  if (cfg_.is_moe()) {
    expert_x_.resize(N * cfg_.n_experts_used * cfg_.dim);
    expert_y_.resize(N * cfg_.n_experts_used * cfg_.dim);
  }
}

void Transformer::embed(std::span<const int32_t> tokens) {
  const TensorView& emb = model_.weights().token_embd;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= cfg_.vocab_size)
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(cfg_.vocab_size) + ")");
    dequantize_row(emb.type, emb.row(id), x_.data() + t * cfg_.dim, cfg_.dim);
    model_.release_embedding_row(id);
    if (cfg_.embedding_scale != 1.0f) scale_inplace(x_.data() + t * cfg_.dim, cfg_.dim, cfg_.embedding_scale);
  }
}

void Transformer::project_qkv(const LayerWeights& w, int64_t n) {
  const int64_t dim = cfg_.dim;
  rmsnorm_rows(x_.data(), w.attn_norm.data(), n, dim, cfg_.norm_eps, xn_.data());
  const MatmulProduct qkv[] = {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
  matmul_shared_input(qkv, xn_.data(), n);
  add_bias(q_.data(), n, w.bq);
  add_bias(k_.data(), n, w.bk);
  add_bias(v_.data(), n, w.bv);
  if (!w.q_norm.empty()) rmsnorm_rows(q_.data(), w.q_norm.data(), n * cfg_.n_heads, cfg_.head_dim, cfg_.norm_eps, q_.data());
  if (!w.k_norm.empty()) rmsnorm_rows(k_.data(), w.k_norm.data(), n * cfg_.n_kv_heads, cfg_.head_dim, cfg_.norm_eps, k_.data());
}

void Transformer::attention_block(int64_t layer, int64_t n, ContiguousKVCache& cache) {
  const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
  const int64_t kvd = cfg_.kv_dim();
  const int64_t pos0 = cache.size();
  const bool mla = cfg_.is_mla();
  project_attention(w, n);
  choose_kv_rotation(cache.type());
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t t = 0; t < n; ++t) {
    if (!mla) rotate_qk(t, layer);
    rotate_for_cache(t);
    cache.write(layer, pos0 + t, k_.data() + t * kvd, mla ? nullptr : v_.data() + t * kvd);
  }
  const bool decompressed = mla && (mla_decompressed_ || (mla_decompressed_decode_ && n == 1));
  const auto start = std::chrono::steady_clock::now();
  if (decompressed) attend_decompressed(layer, n, pos0, cache);
  else attend(layer, n, pos0, cache);
  attention_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!decompressed) unrotate_attention_output(n);
  attention_output(w, n, decompressed);
  add_residual(w.attn_post_norm, n);
}

void Transformer::attend(int64_t layer, int64_t n, int64_t pos0, const ContiguousKVCache& cache) {
  const AttentionShape shape = attention_shape(layer);
  const KVRows k = cache.k_rows(layer), v = cache.v_rows(layer);
  const int64_t n_kv = pos0 + n;
  if (attention_ == AttentionKernel::kFlash) return flash_attention(q_.data(), n, pos0, k, v, n_kv, shape, attn_.data());
  // The reference reads token-major f32 rows: the cache (head-major, maybe
  // quantized) is materialized first (what the reference is for: the plain
  // algorithm, not speed).
  const int64_t kvd = cfg_.kv_dim();
  reference_k_.resize(static_cast<size_t>(n_kv * kvd));
  reference_v_.resize(static_cast<size_t>(n_kv * kvd));
  dequantize_kv_rows(k, n_kv, cfg_.n_kv_heads, cfg_.head_dim, reference_k_.data());
  dequantize_kv_rows(v, n_kv, cfg_.n_kv_heads, cfg_.head_dim, reference_v_.data());
  attention_reference(q_.data(), n, pos0, reference_k_.data(), reference_v_.data(), n_kv, kvd, shape, attn_.data());
}

void Transformer::ffn_block(int64_t layer, int64_t n) {
  const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
  if (!w.experts.empty()) return moe_ffn_block(layer, n);
  const int64_t dim = cfg_.dim;
  rmsnorm_rows(x_.data(), w.ffn_norm.data(), n, dim, cfg_.norm_eps, xn_.data());
  const MatmulProduct gate_up[] = {{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}};
  matmul_shared_input(gate_up, xn_.data(), n);
  if (cfg_.ffn_activation == ModelConfig::FfnActivation::kGeluTanh)
    gelu_tanh_mul(gate_.data(), up_.data(), n * cfg_.ffn_dim);
  else
    silu_mul(gate_.data(), up_.data(), n * cfg_.ffn_dim);
  matmul(w.w_down, gate_.data(), n, proj_.data());
  add_residual(w.ffn_post_norm, n);
}

void Transformer::forward(std::span<const int32_t> tokens, ContiguousKVCache& cache, float* logits, bool all_logits) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw Error("forward: empty batch");
  if (!model_.embeds_tokens() || !model_.has_output_head())
    throw Error("a pipeline stage runs in the batching engine (forward_stage), not in a single-sequence decoder");
  if (cache.values_in_keys() != cfg_.is_mla())
    throw Error(std::string("forward: the KV cache ") + (cache.values_in_keys() ? "keeps" : "lacks") +
                " MLA's latent layout, the model " + (cfg_.is_mla() ? "needs it" : "does not"));
  if (cache.size() + n > cache.capacity())
    throw Error("sequence of " + std::to_string(cache.size() + n) + " tokens exceeds the KV cache capacity of " +
                std::to_string(cache.capacity()) + " tokens");
  // A chunk's rows are all written before any is attended: in a ring they must not reach a key still in view.
  if (cache.ring_tokens() > 0 && n + cfg_.sliding_window > cache.ring_tokens())
    throw Error("a chunk of " + std::to_string(n) + " tokens does not fit the sliding layers' ring of " +
                std::to_string(cache.ring_tokens()) + " positions (window " + std::to_string(cfg_.sliding_window) + ")");
  const ScopedActivationPrecision precision(model_.activations());
  resize_scratch(n);
  embed(tokens);
  positions_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) positions_[static_cast<size_t>(t)] = cache.size() + t;
  prepare_rope(positions_);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    attention_block(l, n, cache);
    ffn_block(l, n);
  }
  cache.set_size(cache.size() + n);
  attention_rows_ += n;
  const int64_t first = all_logits ? 0 : n - 1;
  for (int64_t t = first; t < n; ++t)
    rmsnorm(x_.data() + t * cfg_.dim, model_.weights().output_norm.data(), cfg_.dim, cfg_.norm_eps,
            xn_.data() + (t - first) * cfg_.dim);
  output_logits(n - first, logits);
}

void Transformer::output_logits(int64_t n_rows, float* logits) {
  const TensorView& head = model_.weights().output;
  matmul(head, xn_.data(), n_rows, logits);
  const int64_t rows = head.rows(), vocab = cfg_.vocab_size;
  if (cfg_.final_logit_softcap > 0.0f) softcap(logits, n_rows * rows, cfg_.final_logit_softcap);
  if (rows == vocab) return;
  // A truncated head wrote [n_rows][rows]: spread to [n_rows][vocab], last row
  // first (rows move up in place), the missing ids at -inf.
  for (int64_t t = n_rows - 1; t >= 0; --t) {
    float* dst = logits + t * vocab;
    std::memmove(dst, logits + t * rows, static_cast<size_t>(rows) * sizeof(float));
    std::fill(dst + rows, dst + vocab, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace kvserve
