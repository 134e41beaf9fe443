#pragma once
// The engine's draft model: every drafting sequence's draft passes run
// together, and the draft's K/V live in a paged pool of their own (same block
// size and count as the target's, so a sequence the target can hold the draft
// can hold too), with page tables, prefix caching and copy-on-write as the
// target's. Drafting is two-phase so that the scheduler can place drafts
// before they exist: reserve() (while the scheduler plans the step) makes the
// sequence's draft blocks ready for its history plus k drafts, and run() (after
// planning, before the target's forward pass) computes every reserved
// sequence's k drafts, one batched draft pass per draft position. A sequence
// whose history the draft has not seen (its first round, or after rejections)
// catches up in the first pass, under the token budget.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/paged_kv_storage.h"
#include "model/model.h"
#include "model/transformer.h"
#include "sampling/sampler.h"
#include "speculation/drafter.h"

namespace kvserve {

// One sequence's drafts of a step: k tokens to follow `history`, drawn with
// `sampler` into `out` (tokens and the distributions they came from).
struct DraftModelRequest {
  SequenceId seq = 0;
  std::span<const int32_t> history;
  int64_t k = 0;
  Sampler* sampler = nullptr;
  DraftProposal* out = nullptr;
};

class DraftModelBatch {
 public:
  // max_pass_tokens: tokens per draft pass at most (the catch-up of long
  // histories is split into passes; single-token passes take every sequence).
  DraftModelBatch(const Model& draft, int64_t n_blocks, int64_t block_size, bool prefix_caching,
                  int64_t max_pass_tokens);

  // Bytes of one draft block (every layer's K and V, f32), for pool sizing.
  static int64_t bytes_per_block(const ModelConfig& draft, int64_t block_size);

  // Makes `seq`'s draft page table hold its common prefix with `history` and
  // room for history + k - 1 tokens (the last draft is never fed back). False,
  // with the table as it was or shorter, when the pool or the draft's
  // context cannot take them: the sequence then drafts nothing this step.
  bool reserve(SequenceId seq, std::span<const int32_t> history, int64_t k);
  // Computes each request's k drafts (each reserved this step with that k).
  void run(std::span<const DraftModelRequest> requests);
  // Frees the sequence's draft blocks (finished or preempted).
  void release(SequenceId seq);

  const BlockPool& pool() const { return kv_.pool(); }
  int64_t vocab_size() const { return draft_.config().vocab_size; }
  int64_t passes() const { return passes_; }  // draft forward passes run
  // Tokens of history the last run() fed before drafting (what the draft had
  // not seen: a whole prompt on a sequence's first round, 1-2 tokens after).
  int64_t last_catch_up_tokens() const { return last_catch_up_tokens_; }
  // Tokens of `history` the draft would feed before drafting after it: all
  // of them for a sequence it has not seen (its prefix cache aside), the
  // tokens since the draft's last round otherwise (auto mode's catch-up cost).
  int64_t catch_up_tokens(SequenceId seq, std::span<const int32_t> history) const;

 private:
  // One sequence's progress through run().
  struct Pending {
    const DraftModelRequest* request;
    std::vector<int32_t>* cached;  // the tokens whose draft K/V are (being) computed
    size_t fed = 0;                // of cached, the tokens computed so far
    std::vector<int32_t> context;  // history + drafts so far, for the sampler's penalties
  };
  // Feeds each pending sequence its next tokens under the pass budget; fills
  // logits_ with one row per sequence whose chunk reached its last token.
  // Returns those sequences' indices.
  std::vector<size_t> feed_pass(std::vector<Pending>& pending);
  // Draws the next draft of pending[i] from its logits row.
  void draw(Pending& p, std::span<const float> row);

  const Model& draft_;
  int64_t max_pass_tokens_;
  int64_t last_catch_up_tokens_ = 0;
  int64_t context_limit_;
  KVCacheManager kv_;
  PagedKVStorage storage_;
  Transformer transformer_;
  std::unordered_map<SequenceId, std::vector<int32_t>> cached_;  // per sequence, as Pending::cached
  std::vector<float> logits_;
  std::vector<float> scratch_;  // [vocab] Sampler::distribution consumes its input
  std::vector<float> row_probs_;
  std::vector<BlockCopy> copies_;
  int64_t passes_ = 0;
};

}  // namespace kvserve
