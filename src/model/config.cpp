#include "model/config.h"

#include "core/error.h"
#include "model/gguf.h"

namespace kvserve {
namespace {

void require_positive(const std::string& path, const char* what, int64_t v) {
  if (v <= 0) throw Error(path + ": " + what + " must be positive, got " + std::to_string(v));
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GGUFFile& file) {
  ModelConfig c;
  const std::string& path = file.path();
  c.arch = file.get_string("general.architecture");
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "mistral")
    throw Error(path + ": architecture '" + c.arch + "' is not supported (supported: llama, qwen2, mistral)");
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
  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(path + ": head_count " + std::to_string(c.n_heads) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_kv_heads));
  c.head_dim = static_cast<int64_t>(file.get_uint(p + "attention.key_length", static_cast<uint64_t>(c.dim / c.n_heads)));
  require_positive(path, "head dimension", c.head_dim);
  c.rope_dims = static_cast<int64_t>(file.get_uint(p + "rope.dimension_count", static_cast<uint64_t>(c.head_dim)));
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    throw Error(path + ": rope.dimension_count " + std::to_string(c.rope_dims) + " must be even and at most the head size " +
                std::to_string(c.head_dim));
  c.rope_theta = static_cast<float>(file.get_float(p + "rope.freq_base", 10000.0));
  c.norm_eps = static_cast<float>(file.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5));
  // llama.cpp's converter permutes Llama's Q/K rows for the interleaved layout; Qwen2 keeps NeoX halves.
  c.rope_neox = c.arch == "qwen2";
  if (file.has("tokenizer.ggml.tokens"))
    c.vocab_size = static_cast<int64_t>(file.get_string_array("tokenizer.ggml.tokens").size());
  else if (const TensorView* emb = file.find_tensor("token_embd.weight"))
    c.vocab_size = emb->ne[1];
  require_positive(path, "vocabulary size", c.vocab_size);
  return c;
}

}  // namespace kvserve
