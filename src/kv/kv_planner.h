#pragma once
// KV-cache size planning: how many bytes the cache of a model takes for a
// given context, batch and element type, computed the way the engine
// allocates it (whole quantization blocks per cached vector, whole pages of
// `block_size` tokens per sequence), and how many sequences fit in a memory
// budget. Works from a model's KVShape (kv_shape_from_config in model/config.h
// reads a GGUF file's) or from built-in presets of well-known models. The
// page layout is the engine's own (kv_page_layout, also behind its pools:
// kv_pool_sizing.h). See docs/kv_planner.md for the formulas.
#include <cstdint>
#include <string>
#include <vector>

#include "core/kv_type.h"
#include "kv/kv_shape.h"

namespace kvserve {

enum class AttentionKind {
  GroupedQuery,     // K and V per KV head (MHA when n_kv_heads == n_heads)
  MultiHeadLatent,  // MLA: one compressed latent plus the decoupled RoPE key
};

// What the cache has to hold for one model, independent of its weights.
struct KVModelShape {
  std::string name;
  AttentionKind kind = AttentionKind::GroupedQuery;
  int64_t n_layers = 0;
  int64_t n_heads = 0;       // query heads, for display
  int64_t n_kv_heads = 0;    // grouped-query only
  int64_t head_dim = 0;      // grouped-query only
  int64_t kv_lora_rank = 0;  // latent only
  int64_t qk_rope_dim = 0;   // latent only
  int64_t context_length = 0;
  // Sliding-window layers (Gemma 3): how many of the n_layers, and the keys a
  // query sees there; the engine keeps only the window's blocks of those.
  int64_t n_sliding_layers = 0;
  int64_t sliding_window = 0;

  // Vectors cached per layer per token (K and V per KV head, or one latent),
  // and the elements in each; a cached vector is the unit of quantization.
  int64_t vectors_per_layer() const;
  int64_t vector_elems() const;
};

// A grouped-query model's shape (name and query heads left for the caller).
KVModelShape kv_model_shape(const KVShape& shape);

struct KVPreset {
  std::string id;  // what --preset takes
  KVModelShape shape;
};
const std::vector<KVPreset>& kv_presets();
// Throws kvserve::Error naming --preset and listing the known ids.
const KVPreset& find_kv_preset(const std::string& id);

// Blocks a sliding-window layer group (KVCacheManager) holds for one sequence
// at most: the window of the chunk's first query plus the chunk, in whole
// blocks, plus one for a window that does not start on a block boundary.
int64_t sliding_blocks_per_sequence(int64_t window, int64_t chunk, int64_t block_size);

// One sequence's K/V as the engine pages it (whole pages of block_size tokens
// per layer group): what `kv-size` plans with and what the engine's pools are
// sized from (kv_pool_sizing.h).
struct KVPageLayout {
  int64_t sliding_layers = 0;              // layers in the sliding group (0: none)
  int64_t full_page_bytes = 0;             // one page of the layers that keep every position
  int64_t sliding_page_bytes = 0;          // one page of the sliding group's layers
  int64_t pages_per_sequence = 0;          // `context` tokens in whole pages
  int64_t sliding_pages_per_sequence = 0;  // the sliding group's: a window and a chunk, at most pages_per_sequence
};

// `shape`'s layout for sequences of `context` tokens, steps of `chunk` tokens
// (both positive with a sliding group) and pages of block_size > 0 tokens.
// Sliding layers get their own group when the shape has both sliding layers
// and a window. A page size that overflows 64 bits throws kvserve::Error
// naming --block-size.
KVPageLayout kv_page_layout(const KVModelShape& shape, KVType type, int64_t block_size, int64_t context, int64_t chunk);

struct KVPlanRequest {
  int64_t ctx = 0;         // tokens per sequence
  int64_t batch = 1;       // sequences
  int64_t block_size = 16; // tokens per page
  KVType type = KVType::F16;
  int64_t chunk = 512;     // tokens per forward step (the engine's max_batch_tokens): sliding layers keep a window plus a chunk
};

struct KVPlan {
  int64_t bytes_per_token = 0;            // all layers, K+V or latent
  int64_t bytes_per_block = 0;            // one page of block_size tokens, all layers
  int64_t sliding_pages_per_seq = 0;      // pages the sliding layers keep per sequence (0: no sliding layers)
  int64_t every_position_bytes_per_seq = 0;  // whole pages with every layer keeping every position
  int64_t allocated_tokens_per_seq = 0;   // ctx rounded up to whole pages
  int64_t exact_bytes_per_seq = 0;        // ctx * bytes_per_token
  int64_t allocated_bytes_per_seq = 0;    // whole pages
  int64_t exact_bytes = 0;                // whole batch
  int64_t allocated_bytes = 0;            // whole batch
};

// Throws kvserve::Error (naming --ctx, --batch, --block-size or --chunk) for a
// non-positive value or a size that overflows 64 bits. Sliding layers count
// min(ctx, window) positions exactly and sliding_pages_per_seq pages paged.
KVPlan plan_kv_cache(const KVModelShape& shape, const KVPlanRequest& request);

// "Does not fit" is a value: sequences is 0 when the weights leave no room.
struct KVMemoryFit {
  int64_t free_bytes = 0;  // memory left for the cache after the weights
  int64_t sequences = 0;   // whole sequences of ctx tokens, page-rounded
  int64_t max_tokens = 0;  // tokens in whole pages across all sequences
};
KVMemoryFit fit_kv_in_memory(const KVPlan& plan, const KVPlanRequest& request, int64_t mem_bytes,
                             int64_t weights_bytes);

// Parses "80GiB", "500MB", "1.5 GiB", "123456" (bytes). Units: B, KB/MB/GB/TB
// (powers of 1000) and KiB/MiB/GiB/TiB (powers of 1024), case-insensitive;
// one letter K/M/G/T ("8G", "512M") is KiB/MiB/GiB/TiB.
// Fractions round down to whole bytes. Bad text throws naming `flag`.
int64_t parse_byte_size(const std::string& text, const std::string& flag);

// "3.91 GiB": the figure the command prints, GiB = 2^30 bytes.
std::string format_gib(int64_t bytes);

}  // namespace kvserve
