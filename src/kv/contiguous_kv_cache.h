#pragma once
// The simplest KV storage: K and V indexed by position, in any KV element type
// (kernels/kv_quant.h), in blocks of kBlockTokens positions, each block
// head-major (head h's vectors of its positions one after the other: KVRows'
// layout), each vector quantized on its own. Blocks go position-major across
// the layers ([block][layer][head][token][head bytes]), so a sequence of n
// tokens touches the first n / kBlockTokens blocks' pages and no more (with
// huge pages, per-layer arrays each touched a few MB past the last position).
// One sequence; capacity fixed at creation.
//
// Sliding-window layers (Gemma 3) may keep only their last positions: a ring
// of blocks of kRingBlock tokens, read through KVRows' block table (entry i
// is ring block i mod R), so the attention kernels need nothing new. That is
// llama.cpp's SWA cache: Gemma 3 at 16K tokens keeps 3 of its 18 layers whole.
#include <cstdint>
#include <vector>

#include "core/aligned_buffer.h"
#include "kernels/kv_quant.h"

namespace kvserve {

// Which layers keep only a ring, and how long it is.
struct SlidingRing {
  std::vector<bool> layers;  // [n_layers]; empty: no ring
  int64_t window = 0;        // keys a query sees behind itself, itself included
  // Positions past the window the ring also holds: the longest forward() chunk
  // (its rows are written before any is attended) plus how far set_size() may
  // roll the cache back (speculative decoding, benchmark repetitions).
  int64_t slack = 0;
};

class ContiguousKVCache {
 public:
  static constexpr int64_t kBlockTokens = 256;  // a decode key split: one contiguous run per head
  static constexpr int64_t kRingBlock = 64;

  // Throws kvserve::Error when `type` cannot hold heads of head_dim elements.
  // A ring shorter than the capacity replaces the flagged layers' arrays.
  // values_in_keys (MLA's latent rows): V is a view of each K row, no V bytes are kept.
  ContiguousKVCache(int64_t n_layers, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
                    KVType type = KVType::F32, const SlidingRing& ring = {}, bool values_in_keys = false);

  int64_t capacity() const { return capacity_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  KVType type() const { return type_; }
  bool values_in_keys() const { return values_in_keys_; }
  // Whether K is stored in lanes (f16 / bf16 without MLA: kernels/key_lanes.h).
  bool keys_in_lanes() const { return keys_in_lanes_; }
  // Positions [0, size) hold valid K/V. Throws kvserve::Error when a ring
  // layer no longer holds a position the new size's window needs.
  int64_t size() const { return size_; }
  void set_size(int64_t n);
  void clear() { size_ = 0; }
  // Positions a ring layer holds (0: no ring).
  int64_t ring_tokens() const { return ring_blocks_ * kRingBlock; }

  // Stores one token's K and V ([n_kv_heads * head_dim] floats each) at pos,
  // converted to the cache's type (v unused, may be null, when values are in the keys).
  void write(int64_t layer, int64_t pos, const float* k, const float* v);
  // The layer's rows as the attention kernels read them. Valid while the cache lives.
  KVRows k_rows(int64_t layer) const { return rows(layer, true); }
  KVRows v_rows(int64_t layer) const { return rows(layer, false); }
  size_t bytes() const { return k_.size() + v_.size(); }

 private:
  struct Layer {
    bool ring = false;
    std::vector<uint8_t*> k_table, v_table;  // block bases by position / block_tokens
  };
  static int64_t block_tokens(const Layer& l) { return l.ring ? kRingBlock : kBlockTokens; }
  KVRows rows(int64_t layer, bool keys) const;
  // Head 0's vector of `pos` in a table's block (head h at + h * block_tokens * head_bytes).
  static uint8_t* token(const std::vector<uint8_t*>& table, int64_t block_tokens, int64_t pos, size_t head_bytes);

  int64_t capacity_, n_kv_heads_, head_dim_;
  KVType type_;
  bool values_in_keys_ = false;
  bool keys_in_lanes_ = false;
  size_t head_bytes_;
  int64_t window_ = 0;
  int64_t ring_blocks_ = 0;          // R: ring blocks per ring layer (0: no ring)
  std::vector<int64_t> ring_owner_;  // [R * kRingBlock] the position each ring slot holds (-1: none)
  int64_t size_ = 0;
  std::vector<Layer> layers_;
  // The whole layers' blocks, then the ring layers' ring: [block][layer][n_kv_heads][block tokens][head bytes].
  AlignedBuffer<uint8_t> k_;
  AlignedBuffer<uint8_t> v_;
};

}  // namespace kvserve
