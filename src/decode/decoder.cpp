#include "decode/decoder.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve {
namespace {

void check_fits(int64_t current, size_t added, int64_t max_context) {
  if (current + static_cast<int64_t>(added) > max_context)
    throw Error("sequence of " + std::to_string(current + static_cast<int64_t>(added)) +
                " tokens exceeds the context size of " + std::to_string(max_context) + " tokens");
}

}  // namespace

NaiveDecoder::NaiveDecoder(const Model& model, int64_t max_context, KVType kv_type)
    : model_(model), max_context_(max_context), kv_type_(kv_type), transformer_(model, AttentionKernel::kReference),
      logits_(static_cast<size_t>(model.config().vocab_size)) {}

std::span<const float> NaiveDecoder::append(std::span<const int32_t> tokens) {
  check_fits(length(), tokens.size(), max_context_);
  sequence_.insert(sequence_.end(), tokens.begin(), tokens.end());
  // A fresh cache every step: nothing computed before is reused.
  const ModelConfig& c = model_.config();
  ContiguousKVCache scratch(c.n_layers, length(), c.n_kv_heads, c.head_dim, kv_type_, {}, c.is_mla());
  logits_.resize(static_cast<size_t>(c.vocab_size));
  transformer_.forward(sequence_, scratch, logits_.data());
  return logits_;
}

std::span<const float> NaiveDecoder::append_all(std::span<const int32_t> tokens) {
  check_fits(length(), tokens.size(), max_context_);
  sequence_.insert(sequence_.end(), tokens.begin(), tokens.end());
  const ModelConfig& c = model_.config();
  ContiguousKVCache scratch(c.n_layers, length(), c.n_kv_heads, c.head_dim, kv_type_, {}, c.is_mla());
  logits_.resize(static_cast<size_t>(length() * c.vocab_size));
  transformer_.forward(sequence_, scratch, logits_.data(), true);
  const size_t skip = (static_cast<size_t>(length()) - tokens.size()) * static_cast<size_t>(c.vocab_size);
  return std::span<const float>(logits_).subspan(skip);
}

void NaiveDecoder::truncate(int64_t n) {
  if (n < 0 || n > length()) throw Error("truncate: length " + std::to_string(n) + " outside [0, " + std::to_string(length()) + "]");
  sequence_.resize(static_cast<size_t>(n));
}

namespace {
// The reference attention materializes every position, so only flash attention gets a ring.
SlidingRing sliding_ring(const ModelConfig& c, AttentionKernel attention, int64_t prefill_chunk, int64_t max_rewind) {
  if (attention != AttentionKernel::kFlash || c.sliding_window == 0) return {};
  return {c.layer_is_sliding, c.sliding_window, prefill_chunk + max_rewind};
}
}  // namespace

CachedDecoder::CachedDecoder(const Model& model, int64_t max_context, int64_t prefill_chunk,
                             AttentionKernel attention, KVType kv_type, int64_t max_rewind)
    : transformer_(model, attention),
      cache_(model.config().n_layers, max_context, model.config().n_kv_heads, model.config().head_dim, kv_type,
             sliding_ring(model.config(), attention, prefill_chunk, max_rewind), model.config().is_mla()),
      prefill_chunk_(prefill_chunk),
      logits_(static_cast<size_t>(model.config().vocab_size)) {}

std::span<const float> CachedDecoder::append(std::span<const int32_t> tokens) {
  return run(tokens, false);
}

std::span<const float> CachedDecoder::append_all(std::span<const int32_t> tokens) {
  return run(tokens, true);
}

std::span<const float> CachedDecoder::run(std::span<const int32_t> tokens, bool all_logits) {
  check_fits(length(), tokens.size(), cache_.capacity());
  if (tokens.empty()) throw Error("append: no tokens");
  const auto vocab = static_cast<size_t>(transformer_.vocab_size());
  logits_.resize(all_logits ? tokens.size() * vocab : vocab);
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(prefill_chunk_)) {
    const size_t n = std::min(tokens.size() - i, static_cast<size_t>(prefill_chunk_));
    transformer_.forward(tokens.subspan(i, n), cache_, logits_.data() + (all_logits ? i * vocab : 0), all_logits);
  }
  sequence_.insert(sequence_.end(), tokens.begin(), tokens.end());
  return logits_;
}

void CachedDecoder::truncate(int64_t n) {
  if (n < 0 || n > length()) throw Error("truncate: length " + std::to_string(n) + " outside [0, " + std::to_string(length()) + "]");
  sequence_.resize(static_cast<size_t>(n));
  cache_.set_size(n);  // rows past n are simply overwritten later
}

void CachedDecoder::reset() {
  sequence_.clear();
  cache_.clear();
}

std::unique_ptr<Decoder> make_decoder(const std::string& kind, const Model& model, int64_t max_context,
                                      KVType kv_type, int64_t max_rewind) {
  if (max_context <= 0 || max_context > model.config().context_length)
    throw Error("context size " + std::to_string(max_context) + " must be in [1, " +
                std::to_string(model.config().context_length) + "] for this model");
  require_kv_type_fits(kv_type, model.config().head_dim);  // before any allocation
  if (kind == "naive") return std::make_unique<NaiveDecoder>(model, max_context, kv_type);
  if (kind == "cached")
    return std::make_unique<CachedDecoder>(model, max_context, 512, AttentionKernel::kFlash, kv_type, max_rewind);
  if (kind == "cached-reference")
    return std::make_unique<CachedDecoder>(model, max_context, 512, AttentionKernel::kReference, kv_type);
  throw Error("unknown decoder '" + kind + "' (expected naive, cached or cached-reference)");
}

}  // namespace kvserve
