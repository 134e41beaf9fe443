#pragma once
// Random-weight GGUF models with the exact shapes of well-known models, for
// benchmarks and tests where the weights' values do not matter but their
// shapes, types and a working tokenizer do.
//
// Weights are deterministic in (seed, tensor name, row): every row has its
// own generator, so files are byte-identical for a seed whatever the thread
// count, and --layers N gives the same first N blocks as the full model.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kvserve {

struct SynthPreset {
  std::string name;
  std::string arch;  // "llama", "qwen2", "qwen3", "phi3", "gemma3", "qwen2moe", "qwen3moe", "deepseek" or "deepseek2" (also the metadata key prefix)
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int ffn_dim = 0;
  int vocab_size = 0;
  int context_length = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: the head reuses token_embd
  bool qkv_bias = false;         // attn_q/k/v.bias (qwen2)
  float llama3_rope_factor = 0;  // > 0: Llama 3.x RoPE scaling with this factor (rope_freqs.weight)
  int key_length = 0;            // head size when not dim / n_heads (qwen3)
  bool qk_norm = false;          // attn_q_norm / attn_k_norm per head (qwen3)
  bool fused = false;            // attn_qkv and a gate+up ffn_up (phi3)
  int sliding_window = 0;        // gemma3: the window of its sliding layers (five of every six)
  // qwen2moe / qwen3moe: experts per block, used per token, their FFN width,
  // and the shared expert's width (qwen2moe)
  int n_experts = 0;
  int n_experts_used = 0;
  int expert_ffn_dim = 0;
  int shared_expert_ffn_dim = 0;  // deepseek: expert_ffn_dim x its shared expert count
  // > 0: YaRN RoPE scaling by this factor over an original context of yarn_original_context
  float yarn_factor = 0;
  int yarn_original_context = 0;
  int leading_dense_blocks = 0;    // deepseek: the first blocks keep a dense FFN
  float expert_weights_scale = 0;  // deepseek: > 0 written as expert_weights_scale
  // deepseek2: multi-head latent attention (kv_lora_rank > 0; key_length is
  // then kv_lora_rank + qk_rope_dim, the absorbed head), and DeepSeek-V3's
  // router: sigmoid gating, exp_probs_b, expert groups, renormalized weights.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_dim = 0;
  int qk_rope_dim = 0;
  int v_head_dim = 0;
  bool mla_fused_kv_b = false;  // the older deepseek2 layout: one attn_kv_b, key/value_length the decompressed sizes
  bool expert_gating_sigmoid = false;
  bool expert_bias = false;  // exp_probs_b.bias per MoE block
  bool expert_weights_norm = false;
  int expert_groups = 0;
  int expert_groups_used = 0;
  // A yarn_log_multiplier written with the YaRN keys (0: none)
  float yarn_log_multiplier = 0;

  int head_dim() const { return key_length > 0 ? key_length : dim / n_heads; }
};

const std::vector<SynthPreset>& synth_presets();
// Throws kvserve::Error listing the known presets.
const SynthPreset& find_synth_preset(const std::string& name);

// A GPT-2 style byte-level BPE vocabulary of exactly vocab_size tokens: the
// 256 byte symbols (ids 0..255, in byte order), merged tokens learnt from a
// built-in English word list (then synthetic merges once it is exhausted),
// and control tokens at the end.
struct ByteBpeVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control
  std::vector<std::string> merges;   // "left right", highest priority first
  uint32_t eos_id = 0;               // <|endoftext|>, also used as BOS
};
// phi3_specials: also <unk>, <s>, </s> and <|end|> (llama.cpp requires them of phi3 files).
ByteBpeVocab build_synth_vocab(int vocab_size, bool phi3_specials = false);
// The printable stand-in GPT-2 uses for a byte (UTF-8), e.g. ' ' -> "Ġ".
std::string gpt2_byte_symbol(uint8_t byte);

struct SynthOptions {
  std::string preset;
  DType type = DType::Q8_0;  // matrices and embeddings; norms and biases stay f32
  std::string output_path;
  uint64_t seed = 1;
  int layers = 0;  // 0: the preset's layer count
  int context = 0;  // 0: the preset's context length
  std::string chat_template = {};  // written as tokenizer.chat_template when given (tests of template-driven features)
};

// Writes the model to options.output_path. Throws kvserve::Error on an
// unknown preset, an unsupported type or an I/O failure.
void synthesize_model(const SynthOptions& options);

}  // namespace kvserve
