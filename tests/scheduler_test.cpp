// The continuous-batching scheduler with no model: token budgets, chunked
// prefill, decode before admission, prefix hits on admission, preemption of
// the newest sequence when the pool is full, and removal freeing blocks.
#include <gtest/gtest.h>

#include "engine/scheduler.h"

using namespace kvserve;

namespace {

std::unique_ptr<Sequence> make_sequence(SequenceId id, int64_t prompt_len, int32_t seed = 0) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  for (int64_t i = 0; i < prompt_len; ++i) s->tokens.push_back(static_cast<int32_t>((i * 13 + seed) % 500));
  s->prompt_len = prompt_len;
  s->max_kv_tokens = 1 << 20;
  return s;
}

// Runs the step as a model would: marks it computed, then "samples" token 7
// for each chunk that reached its last known token.
void complete(Scheduler& s, const SchedulerOutput& out) {
  s.finish_step(out);
  for (const ScheduledChunk& c : out.chunks)
    if (c.samples) c.seq->tokens.push_back(7);
}

}  // namespace

TEST(Scheduler, ChunksALongPromptUnderTheTokenBudgetWhileOthersDecode) {
  KVCacheManager kv(64, 16, false);
  Scheduler sched({4, 32}, kv);
  sched.add(make_sequence(1, 10));
  SchedulerOutput out = sched.schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].n, 10);
  EXPECT_TRUE(out.chunks[0].samples);
  complete(sched, out);
  sched.add(make_sequence(2, 100));
  out = sched.schedule();  // sequence 1 decodes one token; 2 gets the other 31 of the budget
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.chunks[0].seq->id, 1u);
  EXPECT_EQ(out.chunks[0].n, 1);
  EXPECT_EQ(out.chunks[1].n, 31);
  EXPECT_FALSE(out.chunks[1].samples);
  complete(sched, out);
  int steps = 0;
  while (sched.n_running() == 2 && steps < 10) {
    out = sched.schedule();
    EXPECT_LE(out.num_tokens(), 32);
    EXPECT_EQ(out.chunks[0].n, 1);  // the running decode is never stalled
    complete(sched, out);
    if (out.chunks[1].samples) break;
    steps++;
  }
  EXPECT_EQ(sched.n_running(), 2);
  EXPECT_EQ(kv.pool().used(), 1 + 7);  // 12 tokens -> 1 block, 101 tokens -> 7 blocks
}

TEST(Scheduler, AdmitsNoMoreThanMaxRunning) {
  KVCacheManager kv(64, 16, false);
  Scheduler sched({2, 512}, kv);
  for (SequenceId i = 1; i <= 3; ++i) sched.add(make_sequence(i, 5));
  const SchedulerOutput out = sched.schedule();
  EXPECT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(sched.n_running(), 2);
  EXPECT_EQ(sched.n_waiting(), 1);
}

TEST(Scheduler, PrefixHitsSkipComputedBlocks) {
  KVCacheManager kv(64, 4, true);
  Scheduler sched({4, 512}, kv);
  sched.add(make_sequence(1, 18));
  complete(sched, sched.schedule());
  sched.add(make_sequence(2, 18));
  const SchedulerOutput out = sched.schedule();
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.chunks[1].start, 16);
  EXPECT_EQ(out.chunks[1].n, 2);
  EXPECT_EQ(out.prefix_query_tokens, 18);
  EXPECT_EQ(out.prefix_hit_tokens, 16);
}

// Prompts that arrive together sharing a prefix: the later one waits a step
// and takes the shared full blocks from the cache instead of computing them
// alongside the first; one sharing less than a block, or with prefix caching
// off, is admitted at once.
TEST(Scheduler, APromptSharingAPrefixWithOneBeingPrefilledWaitsAStepForIt) {
  KVCacheManager kv(64, 4, true);
  Scheduler sched({4, 512}, kv);
  sched.add(make_sequence(1, 18));
  sched.add(make_sequence(2, 18));  // the same 18 tokens
  SchedulerOutput out = sched.schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(sched.n_waiting(), 1);
  EXPECT_EQ(kv.pool().used(), 5);  // sequence 2 holds no blocks while it waits
  complete(sched, out);
  out = sched.schedule();
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(out.chunks[1].start, 16);  // four blocks from the cache
  EXPECT_EQ(out.prefix_hit_tokens, 16);

  KVCacheManager other(64, 4, true);
  Scheduler apart({4, 512}, other);
  apart.add(make_sequence(1, 18));
  auto three_tokens_shared = make_sequence(2, 18, 1);
  three_tokens_shared->tokens[0] = 0;  // sequence 1's first three: 0, 13, 26
  three_tokens_shared->tokens[1] = 13;
  three_tokens_shared->tokens[2] = 26;
  apart.add(std::move(three_tokens_shared));
  EXPECT_EQ(apart.schedule().chunks.size(), 2u);

  KVCacheManager uncached(64, 4, false);
  Scheduler plain({4, 512}, uncached);
  plain.add(make_sequence(1, 18));
  plain.add(make_sequence(2, 18));
  EXPECT_EQ(plain.schedule().chunks.size(), 2u);
}

TEST(Scheduler, PreemptsTheNewestWhenThePoolIsFullAndResumesIt) {
  KVCacheManager kv(4, 4, false);  // 16 token slots in all
  Scheduler sched({4, 512}, kv);
  sched.add(make_sequence(1, 7));
  sched.add(make_sequence(2, 7));
  complete(sched, sched.schedule());  // 2 blocks each: the pool is full
  EXPECT_EQ(kv.pool().free(), 0);
  complete(sched, sched.schedule());  // 8 tokens each: still fits
  SchedulerOutput out = sched.schedule();  // 9 tokens: sequence 1 needs a block
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], 2u);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq->id, 1u);
  EXPECT_EQ(sched.n_waiting(), 1);
  EXPECT_EQ(sched.preemptions(), 1);
  complete(sched, out);
  std::unique_ptr<Sequence> done = sched.remove(1);
  ASSERT_TRUE(done);
  EXPECT_EQ(kv.pool().free(), 4);
  out = sched.schedule();  // sequence 2 is recomputed from all of its tokens
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].start, 0);
  EXPECT_EQ(out.chunks[0].n, 9);
  EXPECT_TRUE(out.chunks[0].samples);
  kv.check_integrity();
}

TEST(Scheduler, RemoveFreesBlocksOfWaitingAndRunningSequences) {
  KVCacheManager kv(8, 4, true);
  Scheduler sched({1, 512}, kv);
  sched.add(make_sequence(1, 9));
  sched.add(make_sequence(2, 9));
  complete(sched, sched.schedule());
  EXPECT_GT(kv.pool().used(), 0);
  EXPECT_TRUE(sched.remove(2));
  EXPECT_TRUE(sched.remove(1));
  EXPECT_FALSE(sched.remove(3));
  EXPECT_TRUE(sched.idle());
  EXPECT_EQ(kv.pool().used(), 0);
  EXPECT_EQ(kv.pool().cached(), 2);  // the two full blocks stay for reuse
}
