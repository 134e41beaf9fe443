#pragma once
// Two decoders behind one interface, the bottom rungs of the benchmark ladder:
//  - NaiveDecoder recomputes the whole sequence at every step (all positions'
//    Q, K, V and full attention) and keeps only the last row: the reference.
//  - CachedDecoder prefills the prompt once into a KV cache, then runs one
//    token per step against it, with flash attention by default.
// Both give the same logits up to float rounding. Not thread-safe.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/contiguous_kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace kvserve {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends `tokens` to the sequence; returns the logits [vocab] after the last one.
  // Throws kvserve::Error when the sequence would exceed max_context().
  virtual std::span<const float> append(std::span<const int32_t> tokens) = 0;
  // Like append, but returns every appended token's logits [n][vocab]: row i
  // is the distribution after tokens[i] (speculative verification, perplexity).
  virtual std::span<const float> append_all(std::span<const int32_t> tokens) = 0;
  // Drops the last tokens so that length() == n (rolls back rejected drafts).
  virtual void truncate(int64_t n) = 0;
  // Forgets the sequence.
  virtual void reset() = 0;
  virtual const char* name() const = 0;
  // Query rows processed by attention (per layer), summed over all steps.
  virtual int64_t attention_rows() const = 0;
  // Wall seconds in the attention kernels, summed over all steps (Transformer::attention_seconds).
  virtual double attention_seconds() const = 0;
  virtual int64_t max_context() const = 0;
  int64_t length() const { return static_cast<int64_t>(sequence_.size()); }

 protected:
  std::vector<int32_t> sequence_;
};

class NaiveDecoder : public Decoder {
 public:
  // kv_type: the element type of the scratch cache each step recomputes.
  NaiveDecoder(const Model& model, int64_t max_context, KVType kv_type = KVType::F32);
  std::span<const float> append(std::span<const int32_t> tokens) override;
  std::span<const float> append_all(std::span<const int32_t> tokens) override;
  void truncate(int64_t n) override;
  void reset() override { sequence_.clear(); }
  const char* name() const override { return "naive"; }
  int64_t attention_rows() const override { return transformer_.attention_rows(); }
  double attention_seconds() const override { return transformer_.attention_seconds(); }
  int64_t max_context() const override { return max_context_; }

 private:
  const Model& model_;
  int64_t max_context_;
  KVType kv_type_;
  Transformer transformer_;
  std::vector<float> logits_;      // [vocab], or [n][vocab] after append_all
};

class CachedDecoder : public Decoder {
 public:
  // Prompts longer than prefill_chunk are prefilled in chunks of that size
  // to bound the activation memory. kv_type: the cache's element type.
  // With flash attention, sliding-window layers keep a ring of their last
  // window + prefill_chunk + max_rewind positions (ContiguousKVCache), and
  // truncate() may go back at most max_rewind tokens past what the ring holds.
  // Throws kvserve::Error when kv_type cannot hold the model's heads.
  CachedDecoder(const Model& model, int64_t max_context, int64_t prefill_chunk = 512,
                AttentionKernel attention = AttentionKernel::kFlash, KVType kv_type = KVType::F32,
                int64_t max_rewind = 512);
  std::span<const float> append(std::span<const int32_t> tokens) override;
  std::span<const float> append_all(std::span<const int32_t> tokens) override;
  void truncate(int64_t n) override;
  void reset() override;
  const char* name() const override { return "cached"; }
  KVType kv_type() const { return cache_.type(); }
  int64_t attention_rows() const override { return transformer_.attention_rows(); }
  double attention_seconds() const override { return transformer_.attention_seconds(); }
  int64_t max_context() const override { return cache_.capacity(); }

 private:
  std::span<const float> run(std::span<const int32_t> tokens, bool all_logits);
  Transformer transformer_;
  ContiguousKVCache cache_;
  int64_t prefill_chunk_;
  std::vector<float> logits_;      // [vocab], or [n][vocab] after append_all
};

// kind: "naive" (reference attention, full recompute), "cached" (KV cache,
// flash attention) or "cached-reference" (KV cache, reference attention: the
// ladder's rung before flash attention). max_context <= the model's context length.
// kv_type: the KV cache's element type (f32 keeps the exact reference numbers).
// max_rewind: how far truncate() must be able to go back ("cached": see CachedDecoder).
std::unique_ptr<Decoder> make_decoder(const std::string& kind, const Model& model, int64_t max_context,
                                      KVType kv_type = KVType::F32, int64_t max_rewind = 512);

}  // namespace kvserve
