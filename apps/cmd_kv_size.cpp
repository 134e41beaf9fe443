// `kvserve kv-size (MODEL.gguf | --preset NAME) [--ctx N --batch N --kv-type T --block-size N --chunk N]
//  [--mem SIZE --weights-bytes SIZE] [--json]`: the KV cache size the engine allocates, and how
// many sequences fit in a memory budget. `--list-presets` lists the built-in models.
#include <charconv>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "apps/commands.h"
#include "core/error.h"
#include "kv/kv_planner.h"
#include "model/config.h"
#include "model/gguf.h"

namespace kvserve::cli {
namespace {

// Counts are read as text so that a malformed one is a kvserve::Error (exit
// code 1, naming the flag) like every other bad value here.
struct KVSizeOptions {
  std::string model_path;
  std::string preset;
  bool list_presets = false;
  std::string ctx;  // empty: the model's trained context
  std::string batch = "1";
  std::string kv_type = "f16";
  std::string block_size = "16";
  std::string chunk = "512";
  std::string mem;
  std::string weights_bytes;
  bool json = false;
};

// The model to plan for, from a file or a preset.
struct KVSource {
  KVModelShape shape;
  std::string origin;                 // "preset NAME" or the file path
  std::optional<int64_t> file_bytes;  // default for --weights-bytes
};

struct KVBudget {
  int64_t mem_bytes = 0;
  int64_t weights_bytes = 0;
  KVMemoryFit fit;
};

KVSource load_source(const KVSizeOptions& opt) {
  if (opt.model_path.empty() == opt.preset.empty())
    throw Error(opt.preset.empty() ? "kv-size needs a MODEL.gguf or --preset NAME (see --list-presets)"
                                   : "kv-size takes a MODEL.gguf or --preset, not both");
  if (!opt.preset.empty()) {
    const KVPreset& preset = find_kv_preset(opt.preset);
    return {preset.shape, "preset " + preset.id, std::nullopt};
  }
  GGUFFile file(opt.model_path);
  return {kv_shape_from_config(ModelConfig::from_gguf(file)), opt.model_path,
          static_cast<int64_t>(file.file_size())};
}

std::optional<KVBudget> make_budget(const KVSizeOptions& opt, const KVSource& source, const KVPlan& plan,
                                    const KVPlanRequest& request) {
  if (opt.mem.empty()) {
    if (!opt.weights_bytes.empty()) throw Error("--weights-bytes needs --mem (the memory budget to fit into)");
    return std::nullopt;
  }
  KVBudget budget;
  budget.mem_bytes = parse_byte_size(opt.mem, "--mem");
  if (!opt.weights_bytes.empty())
    budget.weights_bytes = parse_byte_size(opt.weights_bytes, "--weights-bytes");
  else if (source.file_bytes)
    budget.weights_bytes = *source.file_bytes;
  else
    throw Error("--mem with --preset needs --weights-bytes (a preset has no file to measure; pass 0 for cache only)");
  budget.fit = fit_kv_in_memory(plan, request, budget.mem_bytes, budget.weights_bytes);
  return budget;
}

std::string describe_layout(const KVModelShape& s) {
  char buf[200];
  if (s.kind == AttentionKind::MultiHeadLatent)
    std::snprintf(buf, sizeof buf, "MLA, %lld layers x 1 latent of %lld (kv_lora_rank %lld + qk_rope_dim %lld)",
                  static_cast<long long>(s.n_layers), static_cast<long long>(s.vector_elems()),
                  static_cast<long long>(s.kv_lora_rank), static_cast<long long>(s.qk_rope_dim));
  else
    std::snprintf(buf, sizeof buf, "%s, %lld layers x %lld KV heads x %lld dims, K and V (%lld query heads)",
                  s.n_kv_heads == s.n_heads ? "MHA" : "GQA", static_cast<long long>(s.n_layers),
                  static_cast<long long>(s.n_kv_heads), static_cast<long long>(s.head_dim),
                  static_cast<long long>(s.n_heads));
  return buf;
}

void print_size_row(const char* label, int64_t tokens_per_seq, int64_t batch, int64_t bytes) {
  std::printf("%-18s %12lld %6lld %16lld %12s\n", label, static_cast<long long>(tokens_per_seq),
              static_cast<long long>(batch), static_cast<long long>(bytes), format_gib(bytes).c_str());
}

void print_table(const KVSource& source, const KVPlanRequest& request, const KVPlan& plan,
                 const std::optional<KVBudget>& budget) {
  const KVTypeInfo& type = kv_type_info(request.type);
  std::printf("model:      %s (%s)\n", source.shape.name.c_str(), source.origin.c_str());
  std::printf("layout:     %s\n", describe_layout(source.shape).c_str());
  if (type.block_elems == 1)
    std::printf("kv type:    %s (%lld bytes per element)\n", type.name, static_cast<long long>(type.block_bytes));
  else
    std::printf("kv type:    %s (%lld bytes per block of %lld elements)\n", type.name,
                static_cast<long long>(type.block_bytes), static_cast<long long>(type.block_elems));
  std::printf("per token:  %lld bytes (%.2f KiB); per %lld-token page: %lld bytes\n\n",
              static_cast<long long>(plan.bytes_per_token), static_cast<double>(plan.bytes_per_token) / 1024.0,
              static_cast<long long>(request.block_size), static_cast<long long>(plan.bytes_per_block));
  std::printf("%-18s %12s %6s %16s %12s\n", "", "tokens/seq", "seqs", "bytes", "size");
  print_size_row("exact", request.ctx, request.batch, plan.exact_bytes);
  const std::string paged = "paged (" + std::to_string(request.block_size) + "/page)";
  print_size_row(paged.c_str(), plan.allocated_tokens_per_seq, request.batch, plan.allocated_bytes);
  if (plan.sliding_pages_per_seq > 0) {
    print_size_row("paged, none freed", plan.allocated_tokens_per_seq, request.batch,
                   plan.every_position_bytes_per_seq * request.batch);
    std::printf("\nsliding:    %lld of %lld layers see the last %lld tokens and keep %lld pages per sequence\n"
                "            (window + a %lld-token chunk, --chunk); the others keep every page\n",
                static_cast<long long>(source.shape.n_sliding_layers), static_cast<long long>(source.shape.n_layers),
                static_cast<long long>(source.shape.sliding_window), static_cast<long long>(plan.sliding_pages_per_seq),
                static_cast<long long>(request.chunk));
  }
  if (!budget) return;
  std::printf("\nmemory:     %s - %s weights = %s for the cache\n", format_gib(budget->mem_bytes).c_str(),
              format_gib(budget->weights_bytes).c_str(), format_gib(budget->fit.free_bytes).c_str());
  if (budget->weights_bytes >= budget->mem_bytes)
    std::printf("fits:       nothing: the weights alone exceed the memory budget\n");
  else if (budget->fit.sequences == 0)
    std::printf("fits:       no sequence of %lld tokens (one needs %s)\n", static_cast<long long>(request.ctx),
                format_gib(plan.allocated_bytes_per_seq).c_str());
  else
    std::printf("fits:       %lld sequences of %lld tokens\n", static_cast<long long>(budget->fit.sequences),
                static_cast<long long>(request.ctx));
  std::printf("max tokens: %lld in the cache across all sequences\n", static_cast<long long>(budget->fit.max_tokens));
}

nlohmann::ordered_json shape_json(const KVModelShape& s) {
  nlohmann::ordered_json j = {{"name", s.name}, {"n_layers", s.n_layers}, {"n_heads", s.n_heads},
                      {"context_length", s.context_length}};
  if (s.kind == AttentionKind::MultiHeadLatent) {
    j["attention"] = "mla";
    j["kv_lora_rank"] = s.kv_lora_rank;
    j["qk_rope_dim"] = s.qk_rope_dim;
  } else {
    j["attention"] = s.n_kv_heads == s.n_heads ? "mha" : "gqa";
    j["n_kv_heads"] = s.n_kv_heads;
    j["head_dim"] = s.head_dim;
  }
  return j;
}

void print_json(const KVSource& source, const KVPlanRequest& request, const KVPlan& plan,
                const std::optional<KVBudget>& budget) {
  nlohmann::ordered_json j = {
      {"model", shape_json(source.shape)},
      {"source", source.origin},
      {"kv_type", kv_type_info(request.type).name},
      {"ctx", request.ctx},
      {"batch", request.batch},
      {"block_size", request.block_size},
      {"bytes_per_token", plan.bytes_per_token},
      {"bytes_per_block", plan.bytes_per_block},
      {"exact", {{"tokens_per_seq", request.ctx}, {"bytes", plan.exact_bytes}, {"gib", format_gib(plan.exact_bytes)}}},
      {"paged",
       {{"tokens_per_seq", plan.allocated_tokens_per_seq},
        {"bytes", plan.allocated_bytes},
        {"gib", format_gib(plan.allocated_bytes)}}},
  };
  if (plan.sliding_pages_per_seq > 0)
    j["sliding"] = {{"layers", source.shape.n_sliding_layers},
                    {"window", source.shape.sliding_window},
                    {"chunk", request.chunk},
                    {"pages_per_seq", plan.sliding_pages_per_seq},
                    {"bytes_if_none_freed", plan.every_position_bytes_per_seq * request.batch}};
  if (budget)
    j["memory"] = {{"mem_bytes", budget->mem_bytes},     {"weights_bytes", budget->weights_bytes},
                   {"free_bytes", budget->fit.free_bytes}, {"sequences", budget->fit.sequences},
                   {"max_tokens", budget->fit.max_tokens}};
  std::printf("%s\n", j.dump(2).c_str());
}

void list_presets() {
  std::printf("%-16s %-24s %s\n", "preset", "model", "cache layout");
  for (const KVPreset& p : kv_presets())
    std::printf("%-16s %-24s %s\n", p.id.c_str(), p.shape.name.c_str(), describe_layout(p.shape).c_str());
}

// Range checks (positive) are plan_kv_cache's; this only reads the integer.
int64_t parse_count(const std::string& text, const std::string& flag) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw Error(flag + ": expected a whole number, got '" + text + "'");
  return value;
}

void run_kv_size(const KVSizeOptions& opt) {
  if (opt.list_presets) return list_presets();
  const KVSource source = load_source(opt);
  KVPlanRequest request;
  request.ctx = opt.ctx.empty() ? source.shape.context_length : parse_count(opt.ctx, "--ctx");
  request.batch = parse_count(opt.batch, "--batch");
  request.block_size = parse_count(opt.block_size, "--block-size");
  request.type = parse_kv_type(opt.kv_type, "--kv-type");
  request.chunk = parse_count(opt.chunk, "--chunk");
  const KVPlan plan = plan_kv_cache(source.shape, request);
  const std::optional<KVBudget> budget = make_budget(opt, source, plan, request);
  if (opt.json)
    print_json(source, request, plan, budget);
  else
    print_table(source, request, plan, budget);
}

}  // namespace

void register_kv_size(CLI::App& app) {
  auto* cmd = app.add_subcommand("kv-size", "KV cache size for a model file or preset, and how many sequences fit");
  auto opt = std::make_shared<KVSizeOptions>();
  cmd->add_option("model", opt->model_path, "GGUF model file (or use --preset)");
  cmd->add_option("--preset", opt->preset, "built-in model, e.g. llama-3.1-8b (see --list-presets)");
  cmd->add_flag("--list-presets", opt->list_presets, "list the built-in models and exit");
  cmd->add_option("--ctx", opt->ctx, "tokens per sequence (default: the model's context length)")
      ->type_name("INT");
  cmd->add_option("--batch", opt->batch, "concurrent sequences")->type_name("INT")->capture_default_str();
  cmd->add_option("--kv-type", opt->kv_type, "cache element type: f32, f16, bf16, q8_0, fp8, q4_0")
      ->capture_default_str();
  cmd->add_option("--block-size", opt->block_size, "tokens per KV page; sequences round up to whole pages")
      ->type_name("INT")
      ->capture_default_str();
  cmd->add_option("--chunk", opt->chunk,
                  "tokens per engine step (--max-batch-tokens): sliding-window layers keep a window plus a chunk")
      ->type_name("INT")
      ->capture_default_str();
  cmd->add_option("--mem", opt->mem, "memory budget for weights + cache, e.g. 80GiB")->type_name("SIZE");
  cmd->add_option("--weights-bytes", opt->weights_bytes, "bytes taken by the weights (default: the model file size)")
      ->type_name("SIZE");
  cmd->add_flag("--json", opt->json, "print JSON instead of a table");
  cmd->callback([opt] { run_kv_size(*opt); });
}

}  // namespace kvserve::cli
