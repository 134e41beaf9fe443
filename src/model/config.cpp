#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "kv/kv_planner.h"
#include "kv/kv_shape.h"
#include "model/gguf.h"

namespace kvserve {
namespace {

void require_positive(const std::string& path, const char* what, int64_t v) {
  if (v <= 0) throw Error(path + ": " + what + " must be positive, got " + std::to_string(v));
}

// A finite positive number under `key`, or `fallback` when absent.
double positive_float(const GGUFFile& file, const std::string& key, double fallback) {
  const double v = file.get_float(key, fallback);
  if (!(v > 0.0) || !std::isfinite(v)) throw Error(file.path() + ": " + key + " must be a positive number, got " + std::to_string(v));
  return v;
}

// YaRN as llama.cpp sets it up (llama_context's yarn_attn_factor and ggml's
// rope_yarn): angles blended per pair (ext_factor 1), and cos / sin scaled by
// 1 + 0.1 ln(factor) (or, with a yarn_log_multiplier, the ratio llama.cpp takes
// for it) on top of rope_magnitude. The context grows to original x factor
// when the file says less: that is what YaRN is for.
void set_yarn(const std::string& path, double factor, uint64_t original, double log_mul, ModelConfig& c) {
  if (original == 0 || original > (uint64_t{1} << 24))
    throw Error(path + ": rope.scaling.original_context_length " + std::to_string(original) + " is out of range");
  if (!std::isfinite(log_mul)) throw Error(path + ": rope.scaling.yarn_log_multiplier must be finite");
  c.rope_yarn.original_context = static_cast<int64_t>(original);
  const auto mscale = [factor](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (c.rope_yarn.ext_factor != 0.0) c.rope_magnitude *= log_mul != 0.0 ? mscale(1.0) / mscale(log_mul) : mscale(1.0);
  const double extended = static_cast<double>(original) * factor;
  if (extended > static_cast<double>(c.context_length) && extended <= static_cast<double>(int64_t{1} << 24))
    c.context_length = static_cast<int64_t>(extended);
}

void read_yarn(const GGUFFile& file, const std::string& p, double factor, ModelConfig& c) {
  c.rope_yarn.ext_factor = file.get_float(p + "rope.scaling.yarn_ext_factor", 1.0);
  if (!(c.rope_yarn.ext_factor >= 0.0 && c.rope_yarn.ext_factor <= 1.0))
    throw Error(file.path() + ": rope.scaling.yarn_ext_factor must be in [0, 1]");
  c.rope_yarn.beta_fast = positive_float(file, p + "rope.scaling.yarn_beta_fast", 32.0);
  c.rope_yarn.beta_slow = positive_float(file, p + "rope.scaling.yarn_beta_slow", 1.0);
  set_yarn(file.path(), factor,
           file.get_uint(p + "rope.scaling.original_context_length", static_cast<uint64_t>(c.context_length)),
           file.get_float(p + "rope.scaling.yarn_log_multiplier", 0.0), c);
}

// Scaling changes the math of every position past the lowest frequencies:
// what is not implemented is refused, never ignored.
void read_rope_scaling(const GGUFFile& file, const std::string& p, ModelConfig& c) {
  const std::string& path = file.path();
  std::string type = file.get_string(p + "rope.scaling.type", "none");
  double factor = file.get_float(p + "rope.scaling.factor", 1.0);
  if (file.has(p + "rope.scale_linear")) {  // the older key of linear scaling
    type = "linear";
    factor = file.get_float(p + "rope.scale_linear");
  }
  c.rope_attn_factor = positive_float(file, p + "rope.scaling.attn_factor", 1.0);
  c.rope_magnitude = c.rope_attn_factor;
  if (type == "linear" || type == "yarn") {
    if (!(factor > 0.0) || !std::isfinite(factor))
      throw Error(path + ": rope.scaling.factor must be positive for " + type + " scaling, got " + std::to_string(factor));
    c.rope_position_scale = 1.0 / factor;
    if (type == "yarn") read_yarn(file, p, factor, c);
  } else if (type != "none") {
    throw Error(path + ": rope.scaling.type '" + type +
                "' is not supported (supported: none, linear, yarn, and Llama 3's per-frequency factors rope_freqs.weight)");
  }
  if (const TensorView* f = file.find_tensor("rope_freqs.weight")) {
    if (f->type != DType::F32 || f->numel() != c.rope_dims / 2)
      throw Error(path + ": rope_freqs.weight must hold " + std::to_string(c.rope_dims / 2) + " f32 values, got " +
                  std::to_string(f->numel()) + " of type " + dtype_name(f->type));
    c.rope_freq_factors.resize(static_cast<size_t>(f->numel()));
    std::memcpy(c.rope_freq_factors.data(), f->data, c.rope_freq_factors.size() * sizeof(float));
    for (float v : c.rope_freq_factors)
      if (!(v > 0.0f) || !std::isfinite(v)) throw Error(path + ": rope_freqs.weight holds a value that is not positive");
  }
}

// Gemma 3 (llama.cpp's gemma3 graph): sliding layers in a pattern of 6 (the
// sixth global) unless the file lists them, their own RoPE base (10000 by
// default), embeddings scaled by sqrt(dim), GELU-gated FFN, optional final
// logit soft-capping, and the 27B's query scale 1 / sqrt(dim / heads).
void read_gemma3(const GGUFFile& file, const std::string& p, ModelConfig& c) {
  const std::string& path = file.path();
  c.embedding_scale = std::sqrt(static_cast<float>(c.dim));
  c.ffn_activation = ModelConfig::FfnActivation::kGeluTanh;
  c.final_logit_softcap = static_cast<float>(file.get_float(p + "final_logit_softcapping", 0.0));
  if (!(c.final_logit_softcap >= 0.0f) || !std::isfinite(c.final_logit_softcap))
    throw Error(path + ": final_logit_softcapping must be a non-negative number");
  if (c.n_layers == 62)  // gemma_pytorch's config: the 27B scales queries by the model width per head
    c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads));
  // Bounded before any arithmetic: a hostile value must not wrap to a negative window or period.
  constexpr uint64_t kMaxWindow = uint64_t{1} << 40;
  const uint64_t window = file.get_uint(p + "attention.sliding_window", 0);
  if (window > kMaxWindow)
    throw Error(path + ": attention.sliding_window " + std::to_string(window) + " is out of range");
  c.sliding_window = static_cast<int64_t>(window);
  if (c.sliding_window == 0) return;
  c.rope_theta_sliding = static_cast<float>(file.get_float(p + "rope.freq_base_swa", 10000.0));
  if (!(c.rope_theta_sliding > 0.0f)) throw Error(path + ": rope.freq_base_swa must be positive");
  c.layer_is_sliding.assign(static_cast<size_t>(c.n_layers), false);
  const std::string pattern_key = p + "attention.sliding_window_pattern";
  if (const GGUFValue* v = file.find(pattern_key); v && v->type == GGUFType::ARRAY) {
    const std::vector<double>& flags = file.get_number_array(pattern_key);
    if (static_cast<int64_t>(flags.size()) != c.n_layers)
      throw Error(path + ": " + pattern_key + " has " + std::to_string(flags.size()) + " entries for " +
                  std::to_string(c.n_layers) + " layers");
    for (size_t l = 0; l < flags.size(); ++l) c.layer_is_sliding[l] = flags[l] != 0.0;
    return;
  }
  const uint64_t pattern = file.get_uint(pattern_key, 6);
  if (pattern > kMaxWindow) throw Error(path + ": " + pattern_key + " " + std::to_string(pattern) + " is out of range");
  const auto period = static_cast<int64_t>(pattern);
  for (int64_t l = 0; l < c.n_layers; ++l)
    c.layer_is_sliding[static_cast<size_t>(l)] = period == 0 || l % period < period - 1;
}

// DeepSeek-V2/V3's router options (llama.cpp's build_moe_ffn): renormalized
// weights, sigmoid gating (V3; absent: softmax, as llama.cpp assumes of V2
// files), and expert groups.
void read_deepseek2_router(const GGUFFile& file, const std::string& p, ModelConfig& c) {
  const std::string& path = file.path();
  c.expert_weights_norm = file.get_bool(p + "expert_weights_norm", false);
  const uint64_t gating = file.get_uint(p + "expert_gating_func", 1);
  if (gating != 1 && gating != 2)
    throw Error(path + ": " + p + "expert_gating_func " + std::to_string(gating) +
                " is not supported (1: softmax, 2: sigmoid)");
  c.expert_gating_sigmoid = gating == 2;
  const uint64_t groups = file.get_uint(p + "expert_group_count", 0);
  const uint64_t used = file.get_uint(p + "expert_group_used_count", 0);
  if (groups <= 1) return;
  const auto n = static_cast<uint64_t>(c.n_experts);
  if (groups >= n || n % groups != 0 || n / groups < 2 || used == 0 || used >= groups)
    throw Error(path + ": " + p + "expert_group_count " + std::to_string(groups) + " / expert_group_used_count " +
                std::to_string(used) + " must split the " + std::to_string(n) +
                " experts evenly, two or more per group, and keep 1..count-1 groups");
  if (used * (n / groups) < static_cast<uint64_t>(c.n_experts_used))
    throw Error(path + ": the " + std::to_string(used) + " expert groups used hold fewer than expert_used_count experts");
  c.expert_groups = static_cast<int64_t>(groups);
  c.expert_groups_used = static_cast<int64_t>(used);
}

// MLA (deepseek2). As llama.cpp's current converter writes it, key_length /
// value_length hold the absorbed sizes (kv_lora_rank + RoPE dims, and
// kv_lora_rank), key_length_mla / value_length_mla the per-head sizes of the
// decompressed form; older files have only the latter, as key_length /
// value_length, and a fused attn_kv_b (mla_fused_kv_b). The cache row is the
// kernel's one KV head either way.
void read_mla(const GGUFFile& file, const std::string& p, ModelConfig& c) {
  const std::string& path = file.path();
  c.mla_fused_kv_b = !file.has(p + "attention.key_length_mla") && !file.has(p + "attention.value_length_mla");
  const std::string key_mla_key = c.mla_fused_kv_b ? "attention.key_length" : "attention.key_length_mla";
  const std::string value_mla_key = c.mla_fused_kv_b ? "attention.value_length" : "attention.value_length_mla";
  constexpr uint64_t kMaxWidth = uint64_t{1} << 16;
  const auto bounded = [&](const std::string& key, uint64_t v, uint64_t lo) {
    if (v < lo || v > kMaxWidth)
      throw Error(path + ": " + p + key + " " + std::to_string(v) + " is out of range " + std::to_string(lo) + ".." +
                  std::to_string(kMaxWidth));
    return static_cast<int64_t>(v);
  };
  const int64_t rank = bounded("attention.kv_lora_rank", file.get_uint(p + "attention.kv_lora_rank"), 1);
  const int64_t rope = bounded("rope.dimension_count", file.get_uint(p + "rope.dimension_count"), 2);
  const int64_t key_mla = bounded(key_mla_key, file.get_uint(p + key_mla_key), 1);
  c.v_head_dim = bounded(value_mla_key, file.get_uint(p + value_mla_key), 1);
  c.q_lora_rank = bounded("attention.q_lora_rank", file.get_uint(p + "attention.q_lora_rank", 0), 0);
  if (key_mla <= rope)
    throw Error(path + ": " + p + key_mla_key + " " + std::to_string(key_mla) + " must exceed rope.dimension_count " +
                std::to_string(rope));
  const uint64_t key = file.get_uint(p + "attention.key_length", static_cast<uint64_t>(rank + rope));
  const uint64_t value = file.get_uint(p + "attention.value_length", static_cast<uint64_t>(rank));
  if (!c.mla_fused_kv_b && (key != static_cast<uint64_t>(rank + rope) || value != static_cast<uint64_t>(rank)))
    throw Error(path + ": attention.key_length / value_length " + std::to_string(key) + " / " + std::to_string(value) +
                " must be kv_lora_rank + rope.dimension_count / kv_lora_rank (" + std::to_string(rank + rope) + " / " +
                std::to_string(rank) + ")");
  c.kv_lora_rank = rank;
  c.qk_nope_dim = key_mla - rope;
  c.head_dim = rank + rope;
  c.n_kv_heads = 1;
}

// MoE blocks (llama.cpp's qwen2moe / qwen3moe / deepseek graphs): softmax
// router, top-k; qwen3moe renormalizes the k weights, qwen2moe adds a shared
// expert behind a sigmoid gate, deepseek ungated shared experts, dense leading
// blocks and a weight scale. Counts are bounded before they size anything.
void read_experts(const GGUFFile& file, const std::string& p, ModelConfig& c) {
  const std::string& path = file.path();
  constexpr uint64_t kMaxExperts = 4096, kMaxWidth = uint64_t{1} << 24;
  const uint64_t experts = file.get_uint(p + "expert_count", 0), used = file.get_uint(p + "expert_used_count", 0);
  if (experts == 0 || experts > kMaxExperts)
    throw Error(path + ": " + p + "expert_count must be in 1.." + std::to_string(kMaxExperts) + ", got " +
                std::to_string(experts));
  if (used == 0 || used > experts)
    throw Error(path + ": " + p + "expert_used_count must be in 1.." + std::to_string(experts) + " (expert_count), got " +
                std::to_string(used));
  c.n_experts = static_cast<int64_t>(experts);
  c.n_experts_used = static_cast<int64_t>(used);
  // llama.cpp's default when the key is absent: the dense width split over the used experts. Its
  // converter may write one width per layer (an array): kvserve takes it when every layer has the same.
  const std::string width_key = p + "expert_feed_forward_length";
  uint64_t width = static_cast<uint64_t>(c.ffn_dim) / used;
  if (const GGUFValue* v = file.find(width_key); v && v->type == GGUFType::ARRAY) {
    const std::vector<double>& widths = file.get_number_array(width_key);
    if (widths.empty() || std::adjacent_find(widths.begin(), widths.end(), std::not_equal_to<>()) != widths.end())
      throw Error(path + ": " + width_key + " gives layers different expert widths (not supported)");
    if (!(widths[0] >= 0.0 && widths[0] <= 1e9)) throw Error(path + ": " + width_key + " is out of range");
    width = static_cast<uint64_t>(widths[0]);
  } else {
    width = file.get_uint(width_key, width);
  }
  if (width == 0 || width > kMaxWidth)
    throw Error(path + ": " + p + "expert_feed_forward_length " + std::to_string(width) + " is out of range");
  c.expert_ffn_dim = static_cast<int64_t>(width);
  c.expert_weights_norm = c.arch == "qwen3moe";
  if (c.arch == "qwen2moe") {
    const uint64_t shared = file.get_uint(p + "expert_shared_feed_forward_length", static_cast<uint64_t>(c.ffn_dim));
    if (shared == 0 || shared > kMaxWidth)
      throw Error(path + ": " + p + "expert_shared_feed_forward_length " + std::to_string(shared) + " is out of range");
    c.shared_expert_ffn_dim = static_cast<int64_t>(shared);
    c.shared_expert_gated = true;
  }
  if (c.arch == "deepseek" || c.arch == "deepseek2") {  // shared experts as one ungated FFN, dense leading blocks
    const uint64_t shared = file.get_uint(p + "expert_shared_count");
    if (shared == 0 || shared > kMaxExperts)
      throw Error(path + ": " + p + "expert_shared_count " + std::to_string(shared) + " is out of range");
    c.shared_expert_ffn_dim = c.expert_ffn_dim * static_cast<int64_t>(shared);
    const uint64_t dense = file.get_uint(p + "leading_dense_block_count", 0);
    if (dense > static_cast<uint64_t>(c.n_layers))
      throw Error(path + ": " + p + "leading_dense_block_count " + std::to_string(dense) + " exceeds the block count");
    c.leading_dense_blocks = static_cast<int64_t>(dense);
    const double scale = file.get_float(p + "expert_weights_scale", 0.0);
    if (!(scale >= 0.0) || !std::isfinite(scale))
      throw Error(path + ": " + p + "expert_weights_scale must be a non-negative number");
    c.expert_weights_scale = scale == 0.0 ? 1.0 : scale;  // llama.cpp: 0 (absent) scales nothing
  }
  if (c.arch == "deepseek2") read_deepseek2_router(file, p, c);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GGUFFile& file) {
  ModelConfig c;
  const std::string& path = file.path();
  c.arch = file.get_string("general.architecture");
  static constexpr const char* kArchitectures[] = {"llama",  "qwen2",    "qwen3",    "mistral", "phi3",
                                                   "gemma3", "qwen2moe", "qwen3moe", "deepseek", "deepseek2"};
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), c.arch) == std::end(kArchitectures))
    throw Error(path + ": architecture '" + c.arch +
                "' is not supported (supported: llama, qwen2, qwen3, mistral, phi3, gemma3, qwen2moe, qwen3moe, deepseek, deepseek2)");
  c.name = file.get_string("general.name", c.arch);
  const std::string p = c.arch + ".";
  c.n_layers = static_cast<int64_t>(file.get_uint(p + "block_count"));
  c.dim = static_cast<int64_t>(file.get_uint(p + "embedding_length"));
  c.n_heads = static_cast<int64_t>(file.get_uint(p + "attention.head_count"));
  c.n_kv_heads = static_cast<int64_t>(file.get_uint(p + "attention.head_count_kv", static_cast<uint64_t>(c.n_heads)));
  c.ffn_dim = static_cast<int64_t>(file.get_uint(p + "feed_forward_length"));
  c.context_length = static_cast<int64_t>(file.get_uint(p + "context_length", 2048));
  require_positive(path, "block_count", c.n_layers);
  require_positive(path, "embedding_length", c.dim);
  require_positive(path, "attention.head_count", c.n_heads);
  require_positive(path, "attention.head_count_kv", c.n_kv_heads);
  require_positive(path, "feed_forward_length", c.ffn_dim);
  require_positive(path, "context_length", c.context_length);
  c.file_context_length = c.context_length;
  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(path + ": head_count " + std::to_string(c.n_heads) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_kv_heads));
  c.head_dim = static_cast<int64_t>(file.get_uint(p + "attention.key_length", static_cast<uint64_t>(c.dim / c.n_heads)));
  require_positive(path, "head dimension", c.head_dim);
  if (c.arch == "deepseek2") read_mla(file, p, c);
  else if (const auto v = static_cast<int64_t>(file.get_uint(p + "attention.value_length", static_cast<uint64_t>(c.head_dim)));
      v != c.head_dim)
    throw Error(path + ": attention.value_length " + std::to_string(v) + " differs from key_length " +
                std::to_string(c.head_dim) + " (not supported)");
  c.rope_dims = static_cast<int64_t>(file.get_uint(p + "rope.dimension_count", static_cast<uint64_t>(c.head_dim)));
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    throw Error(path + ": rope.dimension_count " + std::to_string(c.rope_dims) + " must be even and at most the head size " +
                std::to_string(c.head_dim));
  c.rope_theta = static_cast<float>(file.get_float(p + "rope.freq_base", 10000.0));
  c.norm_eps = static_cast<float>(file.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5));
  // llama.cpp's converter permutes Llama's Q/K rows for the interleaved layout; Qwen2 keeps NeoX halves.
  c.rope_neox = c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "phi3" || c.arch == "gemma3" ||
                c.arch == "qwen2moe" || c.arch == "qwen3moe";
  if (c.arch == "qwen2moe" || c.arch == "qwen3moe" || c.arch == "deepseek" || c.arch == "deepseek2")
    read_experts(file, p, c);
  if (c.arch == "gemma3") {
    read_gemma3(file, p, c);
  } else if (const auto window = static_cast<int64_t>(file.get_uint(p + "attention.sliding_window", 0));
             window > 0 && window < c.context_length) {
    // A window on every layer (Mistral 7B v0.1): within it that is plain
    // causal attention, so the context stops there.
    c.context_length = window;
  }
  if (file.find_tensor("rope_factors_long.weight") || file.find_tensor("rope_factors_short.weight"))
    throw Error(path + ": LongRoPE (rope_factors_long / rope_factors_short) is not supported");
  read_rope_scaling(file, p, c);
  if (c.is_mla()) {
    // llama.cpp's [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter's factor 0.1 cancelled.
    c.mla_yarn_log_mul = file.get_float(p + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    if (!std::isfinite(c.mla_yarn_log_mul)) throw Error(path + ": rope.scaling.yarn_log_multiplier must be finite");
    c.set_mla_scales();
  }
  if (file.has("tokenizer.ggml.tokens"))
    c.vocab_size = static_cast<int64_t>(file.get_string_array("tokenizer.ggml.tokens").size());
  else if (const TensorView* emb = file.find_tensor("token_embd.weight"))
    c.vocab_size = emb->ne[1];
  require_positive(path, "vocabulary size", c.vocab_size);
  return c;
}

void ModelConfig::override_rope_scaling(const std::string& type, double factor, int64_t original_context) {
  if (type != "none" && type != "linear" && type != "yarn")
    throw Error("--rope-scaling '" + type + "' is not supported (none, linear, yarn)");
  if ((type != "none") && (!(factor > 0.0) || !std::isfinite(factor)))
    throw Error("--rope-scale must be positive for " + type + " scaling, got " + std::to_string(factor));
  if (original_context < 0) throw Error("--yarn-orig-ctx must not be negative");
  if (!rope_freq_factors.empty() && type != "none")
    throw Error(name + ": this model scales RoPE with rope_freqs.weight; --rope-scaling cannot be combined with it");
  // Back to the file's frequencies and context, then the requested scaling.
  const int64_t trained = rope_yarn.original_context > 0 ? rope_yarn.original_context : file_context_length;
  context_length = file_context_length;
  rope_position_scale = 1.0;
  rope_yarn = RopeYarn{};
  rope_magnitude = rope_attn_factor;
  if (type == "linear") {
    rope_position_scale = 1.0 / factor;
    context_length = std::max(context_length, static_cast<int64_t>(std::min(static_cast<double>(context_length) * factor,
                                                                              static_cast<double>(int64_t{1} << 24))));
  } else if (type == "yarn") {
    rope_position_scale = 1.0 / factor;
    rope_yarn.ext_factor = 1.0;
    set_yarn(name, factor, static_cast<uint64_t>(original_context > 0 ? original_context : trained), 0.0, *this);
  }
  if (is_mla()) set_mla_scales();
}

void ModelConfig::set_mla_scales() {
  // llama.cpp's deepseek2 graph: with a yarn_log_multiplier the RoPE magnitude
  // stays the file's attn_factor (mscale / mscale_all_dim is 1 for DeepSeek-V2),
  // and the queries' scale carries YaRN's mscale squared instead.
  const double factor = 1.0 / rope_position_scale;
  const bool yarn = rope_yarn.ext_factor != 0.0 && rope_yarn.original_context > 0;
  if (yarn && mla_yarn_log_mul != 0.0) rope_magnitude = rope_attn_factor;
  // attn_factor_org: the magnitude before ggml's own 1 + 0.1 ln(factor) (applied only with YaRN).
  const double original = yarn ? rope_magnitude : rope_magnitude * (1.0 + 0.1 * std::log(factor));
  const double mscale = original * (1.0 + 0.1 * mla_yarn_log_mul * std::log(factor));
  attention_scale = static_cast<float>(mscale * mscale / std::sqrt(static_cast<double>(mla_key_dim())));
}

KVShape ModelConfig::kv_shape() const {
  return {n_layers, layer_is_sliding, n_kv_heads, head_dim, sliding_window, context_length, kv_lora_rank};
}

KVModelShape kv_shape_from_config(const ModelConfig& config) {
  KVModelShape s = kv_model_shape(config.kv_shape());
  s.name = config.name;
  s.n_heads = config.n_heads;
  return s;
}

}  // namespace kvserve
