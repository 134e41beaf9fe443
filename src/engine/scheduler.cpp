#include "engine/scheduler.h"

#include <algorithm>

#include "core/common_prefix.h"
#include "core/error.h"

namespace kvserve {

int64_t SchedulerOutput::num_tokens() const {
  int64_t n = 0;
  for (const ScheduledChunk& c : chunks) n += c.n;
  return n;
}

Scheduler::Scheduler(const SchedulerConfig& config, KVCacheManager& kv) : config_(config), kv_(kv) {
  if (config.max_running <= 0) throw Error("max_running must be positive, got " + std::to_string(config.max_running));
  if (config.max_batch_tokens <= 0)
    throw Error("max_batch_tokens must be positive, got " + std::to_string(config.max_batch_tokens));
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  check(seq && seq->num_tokens() > 0 && seq->num_computed == 0, "a new sequence has tokens and nothing computed");
  waiting_.push_back(std::move(seq));
}

SchedulerOutput Scheduler::schedule(const DraftSource& drafts) {
  SchedulerOutput out;
  int64_t budget = config_.max_batch_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i)
    if (!schedule_running(i, budget, out, drafts)) break;
  // After a preemption the pool is full: admitting more would only thrash.
  if (out.preempted.empty()) admit_waiting(budget, out);
  return out;
}

bool Scheduler::schedule_running(size_t i, int64_t& budget, SchedulerOutput& out, const DraftSource& drafts) {
  Sequence* seq = running_[i].get();
  const auto later = static_cast<int64_t>(running_.size() - i - 1);
  if (drafts && try_speculate(*seq, later, drafts, budget, out)) return true;
  const int64_t n = std::min(seq->num_uncomputed(), budget);
  check(n > 0, "a running sequence has a token to compute");
  while (!kv_.allocate(seq->id, seq->num_computed, seq->num_computed + n, out.copies)) {
    const bool self = running_.back().get() == seq;
    preempt_newest(out);
    if (self) return false;
  }
  out.chunks.push_back({seq, seq->num_computed, n, seq->num_computed + n == seq->num_tokens()});
  budget -= n;
  return true;
}

bool Scheduler::try_speculate(Sequence& seq, int64_t reserved, const DraftSource& drafts, int64_t& budget,
                              SchedulerOutput& out) {
  const int64_t max_drafts = budget - 1 - reserved;
  if (seq.num_uncomputed() != 1 || max_drafts <= 0) return false;
  const int64_t batch_tokens = config_.max_batch_tokens - budget + 1 + reserved;
  const std::span<const int32_t> proposed = drafts(seq, max_drafts, batch_tokens);
  const auto k = static_cast<int64_t>(proposed.size());
  if (k == 0) return false;
  check(k <= max_drafts, "a draft source proposes at most max_drafts tokens");
  const int64_t n = 1 + k;
  // Each later running sequence may need a fresh block for its own token.
  if (!kv_.can_grow(seq.id, seq.num_computed + n, reserved)) return false;
  if (!kv_.allocate(seq.id, seq.num_computed, seq.num_computed + n, out.copies)) return false;
  seq.tokens.insert(seq.tokens.end(), proposed.begin(), proposed.end());
  seq.num_draft = k;
  out.chunks.push_back({&seq, seq.num_computed, n, true, k});
  budget -= n;
  return true;
}

bool Scheduler::waits_for_shared_prefix(const Sequence& seq, int64_t hit, const SchedulerOutput& out) const {
  if (!kv_.prefix_caching()) return false;
  for (const ScheduledChunk& c : out.chunks) {
    if (c.seq->num_generated() > 0) continue;
    // A prompt prefilled this step: its full blocks up to the chunk's end are in the cache next step.
    const int64_t shared = std::min({static_cast<int64_t>(common_prefix(seq.tokens, c.seq->tokens)), c.start + c.n,
                                     seq.reusable_prefix()});
    if (shared / kv_.block_size() > hit / kv_.block_size()) return true;
  }
  return false;
}

void Scheduler::admit_waiting(int64_t& budget, SchedulerOutput& out) {
  while (!waiting_.empty() && n_running() < config_.max_running && budget > 0) {
    Sequence* seq = waiting_.front().get();
    const auto reusable = std::span<const int32_t>(seq->tokens).first(
        static_cast<size_t>(std::min(seq->num_tokens(), seq->reusable_prefix() + 1)));  // a hit leaves the last one
    const int64_t hit = kv_.match_prefix(seq->id, reusable);
    // Requests that arrive together with a shared prefix (a system prompt):
    // the later ones wait a step and take it from the cache instead of
    // computing it again side by side (SGLang defers them the same way).
    if (waits_for_shared_prefix(*seq, hit, out)) {
      kv_.free(seq->id);
      return;
    }
    seq->num_computed = hit;
    const int64_t n = std::min(seq->num_uncomputed(), budget);
    if (!kv_.allocate(seq->id, seq->num_computed, seq->num_computed + n, out.copies)) {
      kv_.free(seq->id);  // the matched blocks go back to the cache
      seq->num_computed = 0;
      return;
    }
    out.prefix_query_tokens += seq->prompt_len;
    out.prefix_hit_tokens += std::min(hit, seq->prompt_len);
    if (seq->num_generated() == 0) seq->prefix_hit_tokens = std::min(hit, seq->prompt_len);
    out.chunks.push_back({seq, seq->num_computed, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::preempt_newest(SchedulerOutput& out) {
  check(!running_.empty(), "preemption needs a running sequence");
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  check(victim->num_draft == 0, "a preempted sequence holds no drafts (it is not scheduled yet this step)");
  running_.pop_back();
  kv_.free(victim->id);
  victim->num_computed = 0;  // recomputed from its tokens when readmitted
  out.preempted.push_back(victim->id);
  preemptions_++;
  waiting_.push_front(std::move(victim));
}

void Scheduler::finish_step(const SchedulerOutput& output) {
  for (const ScheduledChunk& c : output.chunks) {
    check(c.seq->num_computed == c.start, "chunks continue where the computed tokens end");
    c.seq->num_computed += c.n;
    kv_.commit(c.seq->id, c.seq->tokens, c.seq->num_computed - c.n_draft);  // drafts are not final yet
  }
}

Sequence* Scheduler::fork(SequenceId parent, SequenceId child) {
  const auto it = std::find_if(running_.begin(), running_.end(), [parent](const auto& s) { return s->id == parent; });
  check(it != running_.end(), "fork of a running sequence");
  auto seq = std::make_unique<Sequence>(**it);
  seq->id = child;
  kv_.fork(parent, child);
  running_.push_back(std::move(seq));
  return running_.back().get();
}

void Scheduler::resolve_drafts(Sequence& seq, int64_t accepted) {
  check(accepted >= 0 && accepted <= seq.num_draft, "accepted drafts are among the proposed ones");
  check(seq.num_computed == seq.num_tokens(), "drafts are resolved after their step");
  const int64_t keep = seq.num_tokens() - seq.num_draft + accepted;
  seq.tokens.resize(static_cast<size_t>(keep));
  seq.num_draft = 0;
  seq.num_computed = keep;
  kv_.truncate(seq.id, keep + 1);  // the slot of the round's last token stays: it is computed next step
  kv_.commit(seq.id, seq.tokens, keep);
}

std::unique_ptr<Sequence> Scheduler::remove(SequenceId id) {
  std::unique_ptr<Sequence> found;
  const auto match = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    found = std::move(*it);
    running_.erase(it);
  } else if (auto w = std::find_if(waiting_.begin(), waiting_.end(), match); w != waiting_.end()) {
    found = std::move(*w);
    waiting_.erase(w);
  }
  if (found) kv_.free(id);
  return found;
}

int64_t Scheduler::computed_tokens() const {
  int64_t n = 0;
  for (const auto& s : running_) n += s->num_computed;
  return n;
}

}  // namespace kvserve
