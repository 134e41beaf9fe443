#include "engine/scheduler.h"

#include <algorithm>

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

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_batch_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i)
    if (!schedule_running(i, budget, out)) break;
  // After a preemption the pool is full: admitting more would only thrash.
  if (out.preempted.empty()) admit_waiting(budget, out);
  return out;
}

bool Scheduler::schedule_running(size_t i, int64_t& budget, SchedulerOutput& out) {
  Sequence* seq = running_[i].get();
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

void Scheduler::admit_waiting(int64_t& budget, SchedulerOutput& out) {
  while (!waiting_.empty() && n_running() < config_.max_running && budget > 0) {
    Sequence* seq = waiting_.front().get();
    const int64_t hit = kv_.match_prefix(seq->id, seq->tokens);
    seq->num_computed = hit;
    const int64_t n = std::min(seq->num_uncomputed(), budget);
    if (!kv_.allocate(seq->id, seq->num_computed, seq->num_computed + n, out.copies)) {
      kv_.free(seq->id);  // the matched blocks go back to the cache
      seq->num_computed = 0;
      return;
    }
    out.prefix_query_tokens += seq->prompt_len;
    out.prefix_hit_tokens += std::min(hit, seq->prompt_len);
    out.chunks.push_back({seq, seq->num_computed, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::preempt_newest(SchedulerOutput& out) {
  check(!running_.empty(), "preemption needs a running sequence");
  std::unique_ptr<Sequence> victim = std::move(running_.back());
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
    kv_.commit(c.seq->id, c.seq->tokens, c.seq->num_computed);
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
