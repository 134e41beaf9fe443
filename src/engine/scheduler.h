#pragma once
// Continuous-batching scheduler. Each step it builds one batch under a token
// budget: first the running sequences, oldest first (a decode token each, or
// the next prefill chunk; a decoding sequence may add speculative drafts after
// its token, see DraftSource), then waiting sequences admitted into free capacity
// (prefix cache looked up on admission, prompt prefilled in chunks; a prompt
// sharing full blocks with one prefilled this step waits a step to take them
// from the cache). When the
// pool cannot grow a running sequence, the newest running sequence is
// preempted: its blocks are freed and it goes back to the head of the queue,
// to be recomputed later from its tokens. Never touches model code: it sees
// KV memory only through KVCacheManager.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "decode/sequence.h"
#include "kv/kv_cache_manager.h"

namespace kvserve {

struct SchedulerConfig {
  int64_t max_running = 16;       // sequences in the batch at most
  int64_t max_batch_tokens = 512; // tokens per step (decode + prefill chunks)
};

// Tokens [start, start + n) of one sequence run this step.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;
  int64_t n = 0;
  bool samples = false;  // the chunk reaches the last known token: its logits give the next token
  int64_t n_draft = 0;   // of the n, trailing speculative drafts (logits wanted for the last n_draft + 1)

  // Rows of logits the forward pass returns for the chunk: all n while it has
  // prompt rows to score (the last is also the sampling row), else the last
  // n_draft + 1 when it samples, else none.
  int64_t logit_rows() const {
    if (seq->scores_rows(start, n)) return n;
    return samples ? n_draft + 1 : 0;
  }
};

// Speculative drafts for a running sequence whose only uncomputed token is its
// last one: at most max_drafts token ids to verify after it, or none.
// batch_tokens: the tokens the step holds at least without these drafts (those
// planned so far, this sequence's, one per later running sequence). The span
// must stay valid until schedule() returns.
using DraftSource =
    std::function<std::span<const int32_t>(const Sequence& seq, int64_t max_drafts, int64_t batch_tokens)>;

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<BlockCopy> copies;         // copy-on-write, before the forward
  std::vector<SequenceId> preempted;
  int64_t prefix_query_tokens = 0;       // prompt tokens looked up on admission this step
  int64_t prefix_hit_tokens = 0;         // of which found cached
  int64_t num_tokens() const;
};

class Scheduler {
 public:
  // The KV manager must outlive the scheduler.
  Scheduler(const SchedulerConfig& config, KVCacheManager& kv);

  // Queues a sequence at the back of the waiting queue.
  void add(std::unique_ptr<Sequence> seq);
  // Plans one step; mutates page tables (allocation, prefix hits, preemption).
  // With `drafts`, decoding sequences may append drafts (seq->num_draft): they
  // take budget only beyond one token for each later running sequence, and only
  // pool blocks that no running sequence needs, so speculation never preempts.
  SchedulerOutput schedule(const DraftSource& drafts = {});
  // After the forward pass: the chunks' tokens are computed; full blocks of
  // final (non-draft) tokens are published for prefix reuse.
  void finish_step(const SchedulerOutput& output);
  // Parallel sampling: a new running sequence `child` with the tokens and
  // computed K/V of running sequence `parent`, sharing its blocks (the first
  // write to a shared block copies it). May take the running set past
  // max_running. Returns the child.
  Sequence* fork(SequenceId parent, SequenceId child);
  // After verifying a chunk's drafts: keeps the first `accepted`, drops the
  // rest from the tokens and the page table (trailing blocks back to the pool)
  // and publishes the full blocks now final.
  void resolve_drafts(Sequence& seq, int64_t accepted);
  // Removes a waiting or running sequence and frees its blocks at once
  // (finished or cancelled); nullptr for an unknown id.
  std::unique_ptr<Sequence> remove(SequenceId id);

  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // K/V tokens held by running sequences (for utilization metrics).
  int64_t computed_tokens() const;
  int64_t preemptions() const { return preemptions_; }

 private:
  // Schedules running_[i]; false if the pool could not grow it and it was
  // preempted itself.
  bool schedule_running(size_t i, int64_t& budget, SchedulerOutput& out, const DraftSource& drafts);
  // Schedules `seq`'s last token plus drafts when they fit without taking
  // blocks or budget the `reserved` later sequences need; false (nothing
  // changed) otherwise.
  bool try_speculate(Sequence& seq, int64_t reserved, const DraftSource& drafts, int64_t& budget, SchedulerOutput& out);
  void admit_waiting(int64_t& budget, SchedulerOutput& out);
  // Whether a waiting sequence would find more of its prompt's full blocks in
  // the prefix cache next step, from a prompt being prefilled this step.
  bool waits_for_shared_prefix(const Sequence& seq, int64_t hit, const SchedulerOutput& out) const;
  void preempt_newest(SchedulerOutput& out);

  SchedulerConfig config_;
  KVCacheManager& kv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: oldest first
  int64_t preemptions_ = 0;
};

}  // namespace kvserve
