// `kvserve info MODEL.gguf`: architecture, sizes, tensor types, KV bytes per token.
#include <cstdio>
#include <map>
#include <string>

#include "apps/commands.h"
#include "core/error.h"
#include "model/config.h"
#include "model/gguf.h"

namespace kvserve::cli {
namespace {

void print_config(const GGUFFile& file) {
  ModelConfig c;
  try {
    c = ModelConfig::from_gguf(file);
  } catch (const Error& e) {
    std::printf("model:         not loadable by kvserve: %s\n", e.what());
    return;
  }
  std::printf("model:         %s (%s)\n", c.name.c_str(), c.arch.c_str());
  std::printf("  layers %lld, dim %lld, heads %lld, kv heads %lld (GQA %lld:1), head dim %lld, ffn %lld, vocab %lld\n",
              static_cast<long long>(c.n_layers), static_cast<long long>(c.dim), static_cast<long long>(c.n_heads),
              static_cast<long long>(c.n_kv_heads), static_cast<long long>(c.group_size()),
              static_cast<long long>(c.head_dim), static_cast<long long>(c.ffn_dim),
              static_cast<long long>(c.vocab_size));
  if (c.is_moe())
    std::printf("  experts %lld, %lld used per token (width %lld%s)%s\n", static_cast<long long>(c.n_experts),
                static_cast<long long>(c.n_experts_used), static_cast<long long>(c.expert_ffn_dim),
                c.expert_weights_norm ? ", weights renormalized" : "",
                c.shared_expert_ffn_dim > 0
                    ? (", + a shared expert of width " + std::to_string(c.shared_expert_ffn_dim)).c_str()
                    : "");
  if (c.leading_dense_blocks > 0 || c.expert_weights_scale != 1.0)
    std::printf("  the first %lld blocks dense, expert weights scaled by %g\n",
                static_cast<long long>(c.leading_dense_blocks), c.expert_weights_scale);
  if (c.is_mla())
    std::printf("  multi-head latent attention: kv_lora_rank %lld + RoPE key %lld cached per token and layer "
                "(one row, no separate V), q_lora_rank %lld, per head %lld + %lld query/key dims and %lld value dims\n",
                static_cast<long long>(c.kv_lora_rank), static_cast<long long>(c.rope_dims),
                static_cast<long long>(c.q_lora_rank), static_cast<long long>(c.qk_nope_dim),
                static_cast<long long>(c.rope_dims), static_cast<long long>(c.v_head_dim));
  if (c.expert_gating_sigmoid || c.expert_groups > 1)
    std::printf("  router: %s scores%s\n", c.expert_gating_sigmoid ? "sigmoid" : "softmax",
                c.expert_groups > 1 ? (", the best " + std::to_string(c.expert_groups_used) + " of " +
                                       std::to_string(c.expert_groups) + " expert groups").c_str()
                                    : "");
  std::printf("  context %lld, rope theta %g (%s), rms eps %g\n", static_cast<long long>(c.context_length),
              static_cast<double>(c.rope_theta), c.rope_neox ? "neox" : "interleaved", static_cast<double>(c.norm_eps));
  std::printf("kv cache:      %lld bytes/token in f32, %lld in f16 (%.1f MiB f16 for the full %lld-token context)\n",
              static_cast<long long>(c.kv_bytes_per_token(4)), static_cast<long long>(c.kv_bytes_per_token(2)),
              static_cast<double>(c.kv_bytes_per_token(2) * c.context_length) / 1048576.0,
              static_cast<long long>(c.context_length));
  if (file.get_bool("kvserve.placeholder_vocab", false))
    std::printf("warning:       this file has a placeholder byte-fallback vocabulary, not the model's real one\n");
}

void print_info(const std::string& path) {
  GGUFFile file(path);
  std::printf("file:          %s (%.1f MiB, GGUF v%u)\n", path.c_str(), file.file_size() / 1048576.0, file.version());
  for (const auto& [key, v] : file.metadata()) {
    if (key.rfind("tokenizer.ggml.", 0) == 0 && v.type == GGUFType::ARRAY) {
      std::printf("  %-40s [%zu entries]\n", key.c_str(), v.array_size());
    } else if (v.type == GGUFType::STRING) {
      std::string s = v.str.size() > 60 ? v.str.substr(0, 57) + "..." : v.str;
      for (char& ch : s)
        if (ch == '\n') ch = ' ';
      std::printf("  %-40s %s\n", key.c_str(), s.c_str());
    } else if (v.type == GGUFType::ARRAY) {
      std::printf("  %-40s [%zu entries]\n", key.c_str(), v.array_size());
    } else if (v.is_float()) {
      std::printf("  %-40s %g\n", key.c_str(), v.f);
    } else {
      std::printf("  %-40s %lld\n", key.c_str(), static_cast<long long>(v.i));
    }
  }
  std::map<std::string, std::pair<int, size_t>> by_type;
  for (const auto& t : file.tensors()) {
    auto& e = by_type[dtype_name(t.type)];
    e.first++;
    e.second += t.nbytes;
  }
  if (file.get_bool("kvserve.placeholder_vocab", false)) std::printf("warning:       placeholder vocabulary: text will not decode\n");
  std::printf("tensors:       %zu\n", file.tensors().size());
  int64_t params = 0;
  for (const auto& t : file.tensors()) params += t.numel();
  std::printf("parameters:    %.1f M\n", static_cast<double>(params) / 1e6);
  for (const auto& [name, e] : by_type)
    std::printf("  %-6s %4d tensors, %.2f MiB\n", name.c_str(), e.first, e.second / 1048576.0);
  print_config(file);
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a GGUF model's architecture, sizes and tensor types");
  auto path = std::make_shared<std::string>();
  cmd->add_option("model", *path, "GGUF model file")->required();
  cmd->callback([path] { print_info(*path); });
}

}  // namespace kvserve::cli
