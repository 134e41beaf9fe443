// Parallel sampling (GenerationRequest::n > 1): the prompt is prefilled
// once and forked; greedy sequences equal n = 1, sampled sequence i equals a
// lone request with seed + i and is reproducible, the prompt's blocks are
// shared rather than copied n times, cancel ends every sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "engine_run_util.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::wait_idle;

namespace {

struct SequenceOutputs {
  std::vector<std::vector<int32_t>> tokens;  // [n] per sequence
  std::vector<std::string> finish_reasons;   // [n]
  int64_t peak_blocks_used = 0;
};

// Submits one request and collects every sequence until all have finished.
SequenceOutputs run(Engine& engine, const GenerationRequest& r, int cancel_after_events = -1) {
  SequenceOutputs out;
  out.tokens.resize(static_cast<size_t>(r.n));
  out.finish_reasons.resize(static_cast<size_t>(r.n));
  std::promise<void> done;
  int finals = 0, events = 0;
  std::optional<RequestId> id;
  std::mutex id_mutex;
  std::unique_lock lock(id_mutex);
  id = engine.submit(r, [&](const GenerationEvent& ev) {
    auto& t = out.tokens.at(static_cast<size_t>(ev.index));
    t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
    out.peak_blocks_used = std::max(out.peak_blocks_used, engine.metrics().kv_blocks_used);
    if (++events == cancel_after_events) {
      std::lock_guard wait_for_id(id_mutex);
      engine.cancel(*id);
    }
    if (!ev.finished) return;
    EXPECT_TRUE(out.finish_reasons[static_cast<size_t>(ev.index)].empty()) << "one final event per sequence";
    out.finish_reasons[static_cast<size_t>(ev.index)] = ev.finish_reason;
    if (++finals == r.n) done.set_value();
  });
  lock.unlock();
  EXPECT_TRUE(id.has_value());
  done.get_future().wait();
  return out;
}

GenerationRequest request(int32_t n, float temperature, int64_t max_tokens) {
  GenerationRequest r;
  for (int i = 0; i < 22; ++i) r.prompt.push_back((i * 13 + 5) % 300);
  r.n = n;
  r.sampling.temperature = temperature;
  r.sampling.seed = 1234;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

class ParallelSamplingTest : public engine_run::TinyModelTest {
 protected:
  void SetUp() override {
    TinyModelTest::SetUp();
    EngineOptions o;
    o.block_size = 4;
    o.prefix_caching = false;  // shared blocks come from the fork, not from the prefix cache
    engine_ = std::make_unique<Engine>(*model_, *tokenizer_, o);
  }
  std::unique_ptr<Engine> engine_;
};

}  // namespace

TEST_F(ParallelSamplingTest, GreedyBranchesAreIdenticalToNOne) {
  const SequenceOutputs one = run(*engine_, request(1, 0, 12));
  const SequenceOutputs four = run(*engine_, request(4, 0, 12));
  ASSERT_EQ(one.tokens[0].size(), 12u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(four.tokens[static_cast<size_t>(i)], one.tokens[0]) << "sequence " << i;
    EXPECT_EQ(four.finish_reasons[static_cast<size_t>(i)], "length");
  }
  wait_idle(*engine_);
  EXPECT_EQ(engine_->metrics().requests_finished, 2);
}

TEST_F(ParallelSamplingTest, SampledBranchesAreReproducibleAndEqualLoneRequestsWithSeedPlusIndex) {
  const SequenceOutputs a = run(*engine_, request(4, 0.9f, 10));
  const SequenceOutputs b = run(*engine_, request(4, 0.9f, 10));
  EXPECT_EQ(a.tokens, b.tokens);
  for (int i = 0; i < 4; ++i) {
    GenerationRequest lone = request(1, 0.9f, 10);
    lone.sampling.seed += static_cast<uint64_t>(i);
    EXPECT_EQ(run(*engine_, lone).tokens[0], a.tokens[static_cast<size_t>(i)]) << "sequence " << i;
  }
  EXPECT_NE(a.tokens[0], a.tokens[1]);  // independent streams
}

TEST_F(ParallelSamplingTest, PromptBlocksAreSharedAndThePoolReturnsToIdle) {
  // 22 prompt tokens = 5 full blocks of 4 + a partial one; 10 generated
  // tokens take each sequence to 31 K/V rows = 8 blocks. Shared: 5 + 4 x 3 = 17
  // blocks at most; unshared it would be 4 x 8 = 32.
  const SequenceOutputs r = run(*engine_, request(4, 0.9f, 10));
  EXPECT_GT(r.peak_blocks_used, 8);
  EXPECT_LE(r.peak_blocks_used, 17);
  wait_idle(*engine_);
  const EngineMetrics m = engine_->metrics();
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_blocks_free, m.kv_blocks_total);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.prompt_tokens_total, 22);  // prefilled once
}

TEST_F(ParallelSamplingTest, CancelEndsEveryBranch) {
  const SequenceOutputs r = run(*engine_, request(3, 0.9f, 200), 7);
  for (const std::string& reason : r.finish_reasons) EXPECT_EQ(reason, "cancelled");
  wait_idle(*engine_);
  EXPECT_EQ(engine_->metrics().kv_blocks_used, 0);
}

TEST_F(ParallelSamplingTest, ZeroMaxTokensAndBadNAreHandled) {
  const SequenceOutputs r = run(*engine_, request(3, 0, 0));
  for (const std::string& reason : r.finish_reasons) EXPECT_EQ(reason, "length");
  EXPECT_THROW(engine_->submit(request(0, 0, 4), [](const GenerationEvent&) {}), Error);
  EXPECT_THROW(engine_->submit(request(129, 0, 4), [](const GenerationEvent&) {}), Error);
}
