#include "kv/kv_planner.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string_view>

#include "core/error.h"

namespace kvserve {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Sizes are user-controlled (huge --ctx or --batch), so products are checked
// rather than allowed to wrap into a plausible-looking number.
int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw Error(what + " is too large: the KV cache size overflows 64 bits");
  return out;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) throw Error(what + " is too large: the KV cache size overflows 64 bits");
  return out;
}

void require_positive(int64_t value, const std::string& flag) {
  if (value <= 0) throw Error(flag + " must be positive, got " + std::to_string(value));
}

KVModelShape gqa_preset(const char* name, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                        int64_t context) {
  KVModelShape s;
  s.name = name;
  s.kind = AttentionKind::GroupedQuery;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.context_length = context;
  return s;
}

KVModelShape mla_preset(const char* name, int64_t layers, int64_t heads, int64_t kv_lora_rank, int64_t qk_rope_dim,
                        int64_t context) {
  KVModelShape s;
  s.name = name;
  s.kind = AttentionKind::MultiHeadLatent;
  s.n_layers = layers;
  s.n_heads = heads;
  s.kv_lora_rank = kv_lora_rank;
  s.qk_rope_dim = qk_rope_dim;
  s.context_length = context;
  return s;
}

struct ByteUnit {
  const char* suffix;  // lower case
  int64_t multiplier;
};

constexpr ByteUnit kByteUnits[] = {
    {"", 1},
    {"b", 1},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000 * 1000 * 1000},
    {"tb", int64_t{1000} * 1000 * 1000 * 1000},
    {"kib", int64_t{1} << 10},
    {"mib", int64_t{1} << 20},
    {"gib", int64_t{1} << 30},
    {"tib", int64_t{1} << 40},
    // One letter, as docker's and the JVM's flags take them (8G, 512M): powers of 1024.
    {"k", int64_t{1} << 10},
    {"m", int64_t{1} << 20},
    {"g", int64_t{1} << 30},
    {"t", int64_t{1} << 40},
};

int64_t byte_unit_multiplier(const std::string& unit, const std::string& text, const std::string& flag) {
  const std::string key = lowercase(unit);
  for (const ByteUnit& u : kByteUnits)
    if (key == u.suffix) return u.multiplier;
  throw Error(flag + ": unknown size unit '" + unit + "' in '" + text +
              "' (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, or K, M, G, T for KiB to TiB)");
}

}  // namespace

int64_t KVModelShape::vectors_per_layer() const {
  return kind == AttentionKind::MultiHeadLatent ? 1 : 2 * n_kv_heads;
}

int64_t KVModelShape::vector_elems() const {
  return kind == AttentionKind::MultiHeadLatent ? kv_lora_rank + qk_rope_dim : head_dim;
}

KVModelShape kv_model_shape(const KVShape& shape) {
  KVModelShape s;
  if (shape.kv_lora_rank > 0) {
    s.kind = AttentionKind::MultiHeadLatent;
    s.n_layers = shape.n_layers;
    s.kv_lora_rank = shape.kv_lora_rank;
    s.qk_rope_dim = shape.head_dim - shape.kv_lora_rank;
    s.context_length = shape.context_length;
    return s;
  }
  s.kind = AttentionKind::GroupedQuery;
  s.n_layers = shape.n_layers;
  s.n_kv_heads = shape.n_kv_heads;
  s.head_dim = shape.head_dim;
  s.context_length = shape.context_length;
  if (shape.sliding_window > 0) {
    s.sliding_window = shape.sliding_window;
    s.n_sliding_layers = shape.n_sliding_layers();
  }
  return s;
}

const std::vector<KVPreset>& kv_presets() {
  // From each model's published config.json (num_hidden_layers,
  // num_attention_heads, num_key_value_heads, head_dim, kv_lora_rank,
  // qk_rope_head_dim, max_position_embeddings).
  static const std::vector<KVPreset> presets = {
      {"llama-3.1-8b", gqa_preset("Llama 3.1 8B", 32, 32, 8, 128, 131072)},
      {"llama-3.1-70b", gqa_preset("Llama 3.1 70B", 80, 64, 8, 128, 131072)},
      {"llama-3.1-405b", gqa_preset("Llama 3.1 405B", 126, 128, 8, 128, 131072)},
      {"qwen-2.5-72b", gqa_preset("Qwen 2.5 72B", 80, 64, 8, 128, 32768)},
      {"mistral-large-2", gqa_preset("Mistral Large 2 (123B)", 88, 96, 8, 128, 131072)},
      {"deepseek-v3", mla_preset("DeepSeek V3 (671B)", 61, 128, 512, 64, 163840)},
      {"kimi-k2", mla_preset("Kimi K2 (1T)", 61, 64, 512, 64, 131072)},
  };
  return presets;
}

const KVPreset& find_kv_preset(const std::string& id) {
  const std::string key = lowercase(id);
  std::string known;
  for (const KVPreset& p : kv_presets()) {
    if (key == p.id) return p;
    known += (known.empty() ? "" : ", ") + p.id;
  }
  throw Error("--preset: unknown preset '" + id + "' (known: " + known + ")");
}

int64_t sliding_blocks_per_sequence(int64_t window, int64_t chunk, int64_t block_size) {
  check(window > 0 && chunk > 0 && block_size > 0, "a sliding group's window, chunk and block size are positive");
  // ceil((window + chunk) / block_size) + 1, without overflow for huge --chunk values.
  const int64_t rest = window % block_size + chunk % block_size;
  return window / block_size + chunk / block_size + (rest + block_size - 1) / block_size + 1;
}

KVPageLayout kv_page_layout(const KVModelShape& shape, KVType type, int64_t block_size, int64_t context, int64_t chunk) {
  const bool sliding = shape.n_sliding_layers > 0 && shape.sliding_window > 0;
  KVPageLayout page;
  page.sliding_layers = sliding ? shape.n_sliding_layers : 0;
  const int64_t per_layer = shape.vectors_per_layer() * kv_vector_bytes(type, shape.vector_elems());
  const int64_t layer_page = checked_mul(per_layer, block_size, "--block-size");
  page.full_page_bytes = checked_mul(layer_page, shape.n_layers - page.sliding_layers, "--block-size");
  page.sliding_page_bytes = checked_mul(layer_page, page.sliding_layers, "--block-size");
  page.pages_per_sequence = context > 0 ? context / block_size + (context % block_size != 0) : 0;
  page.sliding_pages_per_sequence =
      sliding ? std::min(page.pages_per_sequence, sliding_blocks_per_sequence(shape.sliding_window, chunk, block_size))
              : 0;
  return page;
}

KVPlan plan_kv_cache(const KVModelShape& shape, const KVPlanRequest& request) {
  require_positive(request.ctx, "--ctx");
  require_positive(request.batch, "--batch");
  require_positive(request.block_size, "--block-size");
  require_positive(request.chunk, "--chunk");
  check(shape.n_layers > 0 && shape.vectors_per_layer() > 0 && shape.vector_elems() > 0,
        "a KV model shape has layers and cached vectors");
  const bool sliding = shape.n_sliding_layers > 0 && shape.sliding_window > 0;
  check(!sliding || shape.n_sliding_layers <= shape.n_layers, "sliding layers are among the layers");
  const int64_t n_sliding = sliding ? shape.n_sliding_layers : 0, n_full = shape.n_layers - n_sliding;
  KVPlan plan;
  const int64_t per_layer = shape.vectors_per_layer() * kv_vector_bytes(request.type, shape.vector_elems());
  plan.bytes_per_token = shape.n_layers * per_layer;
  plan.bytes_per_block = checked_mul(plan.bytes_per_token, request.block_size, "--block-size");
  const KVPageLayout page = kv_page_layout(shape, request.type, request.block_size, request.ctx, request.chunk);
  const int64_t pages = page.pages_per_sequence;
  plan.sliding_pages_per_seq = page.sliding_pages_per_sequence;
  const int64_t sliding_positions = sliding ? std::min(request.ctx, shape.sliding_window) : 0;
  plan.allocated_tokens_per_seq = checked_mul(pages, request.block_size, "--ctx");
  plan.exact_bytes_per_seq = checked_mul(per_layer, checked_mul(n_full, request.ctx, "--ctx") + n_sliding * sliding_positions, "--ctx");
  plan.allocated_bytes_per_seq = checked_add(checked_mul(page.full_page_bytes, pages, "--ctx"),
                                             checked_mul(page.sliding_page_bytes, plan.sliding_pages_per_seq, "--ctx"), "--ctx");
  plan.every_position_bytes_per_seq = checked_mul(plan.bytes_per_block, pages, "--ctx");
  plan.exact_bytes = checked_mul(plan.exact_bytes_per_seq, request.batch, "--batch");
  plan.allocated_bytes = checked_mul(plan.allocated_bytes_per_seq, request.batch, "--batch");
  return plan;
}

KVMemoryFit fit_kv_in_memory(const KVPlan& plan, const KVPlanRequest& request, int64_t mem_bytes,
                             int64_t weights_bytes) {
  KVMemoryFit fit;
  fit.free_bytes = mem_bytes > weights_bytes ? mem_bytes - weights_bytes : 0;
  // Each sequence holds whole pages, so it costs its page-rounded size.
  fit.sequences = fit.free_bytes / plan.allocated_bytes_per_seq;
  fit.max_tokens = fit.free_bytes / plan.bytes_per_block * request.block_size;
  return fit;
}

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos < text.size() && text[pos] == '-') throw Error(flag + ": size must not be negative, got '" + text + "'");
  int64_t whole = 0;
  size_t digits = 0;
  for (; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])); ++pos, ++digits)
    if (__builtin_add_overflow(checked_mul(whole, 10, flag), text[pos] - '0', &whole))
      throw Error(flag + " is too large: '" + text + "'");
  std::string fraction;
  if (pos < text.size() && text[pos] == '.')
    for (++pos; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])); ++pos) fraction += text[pos];
  if (digits == 0 && fraction.empty())
    throw Error(flag + ": expected a size such as 80GiB, 500MB or 123456 (bytes), got '" + text + "'");
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  size_t unit_end = text.size();
  while (unit_end > pos && std::isspace(static_cast<unsigned char>(text[unit_end - 1]))) --unit_end;
  const int64_t multiplier = byte_unit_multiplier(text.substr(pos, unit_end - pos), text, flag);
  int64_t bytes = checked_mul(whole, multiplier, flag);
  // The fraction adds floor(0.ddd * multiplier) bytes, computed exactly in
  // 128 bits (binary units make decimal scaling inexact in doubles).
  if (fraction.size() > 12) throw Error(flag + ": too many decimals in '" + text + "'");
  __int128 numerator = 0, denominator = 1;
  for (char d : fraction) {
    numerator = numerator * 10 + (d - '0');
    denominator *= 10;
  }
  const auto fraction_bytes = static_cast<int64_t>(numerator * multiplier / denominator);
  if (multiplier == 1 && numerator != 0) throw Error(flag + ": '" + text + "' is not a whole number of bytes");
  if (__builtin_add_overflow(bytes, fraction_bytes, &bytes)) throw Error(flag + " is too large: '" + text + "'");
  return bytes;
}

std::string format_gib(int64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / static_cast<double>(kGiB));
  return buf;
}

}  // namespace kvserve
