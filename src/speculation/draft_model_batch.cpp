#include "speculation/draft_model_batch.h"

#include <algorithm>
#include <numeric>

#include "core/common_prefix.h"
#include "core/error.h"
#include "speculation/draft_verification.h"

namespace kvserve {

DraftModelBatch::DraftModelBatch(const Model& draft, int64_t n_blocks, int64_t block_size, bool prefix_caching,
                                 int64_t max_pass_tokens)
    : draft_(draft),
      max_pass_tokens_(std::max<int64_t>(1, max_pass_tokens)),
      context_limit_(std::min(draft.config().context_length, n_blocks * block_size)),
      kv_(n_blocks, block_size, prefix_caching),
      // f32 K/V whatever the target's type: any head size works, and the draft's rows are few.
      storage_(draft.config().n_layers, n_blocks, block_size, draft.config().n_kv_heads, draft.config().head_dim,
               KVType::F32, draft.config().is_mla()),
      transformer_(draft, AttentionKernel::kFlash) {}

namespace {
// What the draft's cache of a sequence keeps of a new history: the common
// prefix, but never the last token (the logits after it are needed, so it is
// always fed).
size_t kept_history(std::span<const int32_t> cached, std::span<const int32_t> history) {
  return std::min(common_prefix(cached, history), history.size() - 1);
}
}  // namespace

int64_t DraftModelBatch::bytes_per_block(const ModelConfig& draft, int64_t block_size) {
  return PagedKVStorage::bytes_per_block(draft.n_layers, block_size, draft.n_kv_heads, draft.head_dim, KVType::F32,
                                         draft.is_mla());
}

bool DraftModelBatch::reserve(SequenceId seq, std::span<const int32_t> history, int64_t k) {
  const auto n_history = static_cast<int64_t>(history.size());
  if (k <= 0 || n_history == 0 || n_history + k - 1 > context_limit_) return false;
  std::vector<int32_t>& cached = cached_[seq];
  const size_t keep = kept_history(cached, history);
  if (keep < cached.size()) {
    kv_.truncate(seq, static_cast<int64_t>(keep));
    cached.resize(keep);
  }
  if (kv_.blocks(seq).empty()) {  // first round, or everything rejected: the prefix cache may have the history
    cached.clear();
    const int64_t hit = kv_.prefix_caching() ? kv_.match_prefix(seq, history) : 0;
    cached.assign(history.begin(), history.begin() + hit);
  }
  copies_.clear();
  if (!kv_.allocate(seq, static_cast<int64_t>(cached.size()), n_history + k - 1, copies_)) return false;
  for (const BlockCopy& c : copies_) storage_.copy_block(c.src, c.dst);
  return true;
}

int64_t DraftModelBatch::catch_up_tokens(SequenceId seq, std::span<const int32_t> history) const {
  if (history.empty()) return 0;
  const auto it = cached_.find(seq);
  const size_t keep = it == cached_.end() ? 0 : kept_history(it->second, history);
  return static_cast<int64_t>(history.size() - keep);
}

void DraftModelBatch::run(std::span<const DraftModelRequest> requests) {
  std::vector<Pending> pending;
  last_catch_up_tokens_ = 0;
  for (const DraftModelRequest& r : requests) {
    check(r.k > 0 && r.sampler != nullptr && r.out != nullptr, "a draft request wants drafts");
    std::vector<int32_t>& cached = cached_.at(r.seq);
    check(cached.size() < r.history.size() && std::equal(cached.begin(), cached.end(), r.history.begin()),
          "reserve() prepared the sequence for this history");
    last_catch_up_tokens_ += static_cast<int64_t>(r.history.size() - cached.size());
    Pending p{&r, &cached, cached.size(), {r.history.begin(), r.history.end()}};
    cached.assign(r.history.begin(), r.history.end());
    r.out->tokens.clear();
    r.out->probs.clear();
    pending.push_back(std::move(p));
  }
  const size_t vocab = static_cast<size_t>(draft_.config().vocab_size);
  while (!pending.empty()) {
    const std::vector<size_t> sampled = feed_pass(pending);
    for (size_t row = 0; row < sampled.size(); ++row)
      draw(pending[sampled[row]], std::span<const float>(logits_).subspan(row * vocab, vocab));
    std::erase_if(pending, [](const Pending& p) {
      return static_cast<int64_t>(p.request->out->tokens.size()) == p.request->k;
    });
  }
  // Only the history is final: published blocks must survive the next round's rollback.
  for (const DraftModelRequest& r : requests)
    kv_.commit(r.seq, cached_.at(r.seq), static_cast<int64_t>(r.history.size()));
}

std::vector<size_t> DraftModelBatch::feed_pass(std::vector<Pending>& pending) {
  // Shortest catch-up first, so that one long history does not hold back the others' drafts.
  std::vector<size_t> order(pending.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const auto remaining = [&](size_t i) { return pending[i].cached->size() - pending[i].fed; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return remaining(a) < remaining(b); });
  int64_t budget = std::max<int64_t>(max_pass_tokens_, static_cast<int64_t>(pending.size()));
  std::vector<SequenceChunk> chunks;
  std::vector<size_t> sampled;
  for (size_t i : order) {
    Pending& p = pending[i];
    const auto n = static_cast<int64_t>(std::min<size_t>(remaining(i), static_cast<size_t>(budget)));
    if (n == 0) break;
    const bool reaches_end = p.fed + static_cast<size_t>(n) == p.cached->size();
    const auto tokens = std::span<const int32_t>(*p.cached).subspan(p.fed, static_cast<size_t>(n));
    chunks.push_back({tokens, static_cast<int64_t>(p.fed), kv_.blocks(p.request->seq), reaches_end, 1});
    if (reaches_end) sampled.push_back(i);
    p.fed += static_cast<size_t>(n);
    budget -= n;
  }
  logits_.resize(sampled.size() * static_cast<size_t>(draft_.config().vocab_size));
  transformer_.forward_batch(chunks, storage_, logits_.data());
  passes_++;
  return sampled;
}

void DraftModelBatch::draw(Pending& p, std::span<const float> row) {
  DraftProposal& out = *p.request->out;
  scratch_.assign(row.begin(), row.end());
  p.request->sampler->distribution(scratch_, p.context, row_probs_);
  out.probs.insert(out.probs.end(), row_probs_.begin(), row_probs_.end());
  const int32_t token = draw_token(row_probs_, *p.request->sampler);
  out.tokens.push_back(token);
  p.context.push_back(token);
  // Every draft but the last is fed back for the next one's logits.
  if (static_cast<int64_t>(out.tokens.size()) < p.request->k) p.cached->push_back(token);
}

void DraftModelBatch::release(SequenceId seq) {
  kv_.free(seq);
  cached_.erase(seq);
}

}  // namespace kvserve
