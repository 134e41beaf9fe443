// Paged attention and continuous batching end to end: paged == contiguous
// attention, copy-on-write isolation and prefix reuse through the batched
// forward pass, and the Engine's outputs under concurrency, preemption and
// cancellation equal to each request run alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "kernels/attention.h"
#include "kernels/paged_attention.h"
#include "kv/kv_cache_manager.h"
#include "model/synth.h"
#include "model/transformer.h"
#include "engine_run_util.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;
using namespace kvserve::engine_run;

namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class BatchingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::kvserve::test_util::write_synth_model(file_.path(), "tiny-llama", DType::F32, 3);
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
  }
  int64_t vocab() const { return model_->config().vocab_size; }
  TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace

TEST(PagedAttention, EqualsContiguousAttention) {
  std::mt19937 rng(5);
  const AttentionShape shape{6, 2, 8};
  const int64_t q_dim = 48, kv_dim = 16, B = 4;
  struct Case { int64_t n_q, pos0; };
  const std::vector<Case> cases = {{1, 0}, {1, 13}, {7, 0}, {5, 9}, {33, 3}, {1, 40}};
  std::vector<std::vector<float>> qs, ks, vs, outs, want;
  std::vector<std::vector<const float*>> kb, vb;
  std::vector<std::vector<float>> block_k, block_v;  // each sequence's blocks, stored in scrambled order
  for (const Case& c : cases) {
    const int64_t n_kv = c.pos0 + c.n_q, n_blocks = (n_kv + B - 1) / B;
    qs.push_back(random_floats(static_cast<size_t>(c.n_q * q_dim), rng));
    ks.push_back(random_floats(static_cast<size_t>(n_kv * kv_dim), rng));
    vs.push_back(random_floats(static_cast<size_t>(n_kv * kv_dim), rng));
    want.emplace_back(static_cast<size_t>(c.n_q * q_dim));
    attention_reference(qs.back().data(), c.n_q, c.pos0, ks.back().data(), vs.back().data(), n_kv, kv_dim, shape,
                        want.back().data());
    block_k.emplace_back(static_cast<size_t>(n_blocks * B * kv_dim), 99.0f);  // padding rows hold junk
    block_v.emplace_back(static_cast<size_t>(n_blocks * B * kv_dim), -99.0f);
    std::vector<int64_t> order(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) order[static_cast<size_t>(b)] = n_blocks - 1 - b;  // logical b -> physical
    kb.emplace_back();
    vb.emplace_back();
    for (int64_t b = 0; b < n_blocks; ++b) {
      float* kdst = block_k.back().data() + order[static_cast<size_t>(b)] * B * kv_dim;
      float* vdst = block_v.back().data() + order[static_cast<size_t>(b)] * B * kv_dim;
      const int64_t rows = std::min(B, n_kv - b * B);
      std::copy_n(ks.back().data() + b * B * kv_dim, rows * kv_dim, kdst);
      std::copy_n(vs.back().data() + b * B * kv_dim, rows * kv_dim, vdst);
      kb.back().push_back(kdst);
      vb.back().push_back(vdst);
    }
    outs.emplace_back(static_cast<size_t>(c.n_q * q_dim));
  }
  std::vector<PagedAttentionJob> jobs;
  for (size_t i = 0; i < cases.size(); ++i)
    jobs.push_back({qs[i].data(), cases[i].n_q, cases[i].pos0, kb[i].data(), vb[i].data(), outs[i].data()});
  paged_attention(jobs, B, kv_dim, shape);
  for (size_t i = 0; i < cases.size(); ++i)
    for (size_t j = 0; j < outs[i].size(); ++j) ASSERT_NEAR(outs[i][j], want[i][j], 1e-5) << "case " << i << " at " << j;
}

// A forked sequence shares the parent's partial block; each side's next
// token goes through copy-on-write and gives the logits of a cold run.
TEST_F(BatchingTest, PagedCopyOnWriteIsolatesForkedSequences) {
  const ModelConfig& c = model_->config();
  KVCacheManager kv(16, 4, false);
  PagedKVStorage storage(c.n_layers, 16, 4, c.kv_dim());
  Transformer t(*model_, AttentionKernel::kFlash);
  const std::vector<int32_t> prompt = {11, 22, 33, 44, 55, 66};
  std::vector<BlockCopy> copies;
  std::vector<float> logits(static_cast<size_t>(2 * vocab()));
  ASSERT_TRUE(kv.allocate(1, 0, 6, copies));
  const SequenceChunk pre{prompt, 0, kv.blocks(1), true};
  t.forward_batch(std::span(&pre, 1), storage, logits.data());
  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate(1, 6, 7, copies));
  ASSERT_TRUE(kv.allocate(2, 6, 7, copies));
  ASSERT_EQ(copies.size(), 1u);
  for (const BlockCopy& bc : copies) storage.copy_block(bc.src, bc.dst);
  const std::vector<int32_t> next_a = {77}, next_b = {88};
  const std::vector<SequenceChunk> step = {{next_a, 6, kv.blocks(1), true}, {next_b, 6, kv.blocks(2), true}};
  t.forward_batch(step, storage, logits.data());
  for (int side = 0; side < 2; ++side) {
    std::vector<int32_t> full = prompt;
    full.push_back(side == 0 ? 77 : 88);
    KVCacheManager cold_kv(16, 4, false);
    PagedKVStorage cold_storage(c.n_layers, 16, 4, c.kv_dim());
    ASSERT_TRUE(cold_kv.allocate(9, 0, 7, copies));
    std::vector<float> cold(static_cast<size_t>(vocab()));
    const SequenceChunk all{full, 0, cold_kv.blocks(9), true};
    t.forward_batch(std::span(&all, 1), cold_storage, cold.data());
    for (int64_t i = 0; i < vocab(); ++i)
      ASSERT_NEAR(logits[static_cast<size_t>(side * vocab() + i)], cold[static_cast<size_t>(i)], 1e-4) << "side " << side;
  }
}

TEST_F(BatchingTest, PrefixHitGivesTheLogitsOfAColdRun) {
  EngineOptions o;
  o.block_size = 4;
  Engine engine(*model_, *tokenizer_, o);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back((i * 7 + 3) % 300);
  GenerationRequest r = greedy_request(prompt, 6);
  r.top_logprobs = 5;
  const Output cold = run_together(engine, {r})[0];
  EXPECT_EQ(engine.metrics().prefix_hit_tokens, 0);
  const Output warm = run_together(engine, {r})[0];
  EXPECT_EQ(engine.metrics().prefix_hit_tokens, 20);
  EXPECT_EQ(warm.tokens, cold.tokens);
  ASSERT_EQ(warm.logprobs.size(), cold.logprobs.size());
  for (size_t i = 0; i < cold.logprobs.size(); ++i)
    for (size_t k = 0; k < cold.logprobs[i].top.size(); ++k) {
      EXPECT_EQ(warm.logprobs[i].top[k].first, cold.logprobs[i].top[k].first);
      EXPECT_NEAR(warm.logprobs[i].top[k].second, cold.logprobs[i].top[k].second, 1e-5);
    }
}

TEST_F(BatchingTest, ConcurrentGreedyRequestsEqualEachRunAlone) {
  const auto requests = mixed_requests(10, vocab(), 24);
  const auto alone = run_alone(*model_, *tokenizer_, requests);
  EngineOptions o;
  o.max_running = 6;
  o.max_batch_tokens = 24;  // prompts are prefilled in chunks next to running decodes
  o.block_size = 4;
  Engine engine(*model_, *tokenizer_, o);
  const auto together = run_together(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].finish_reason, "length");
  }
  EXPECT_GT(engine.metrics().prefix_hit_tokens, 0);
}

TEST_F(BatchingTest, PreemptionUnderATinyPoolGivesIdenticalOutputs) {
  const auto requests = mixed_requests(8, vocab(), 30);
  const auto alone = run_alone(*model_, *tokenizer_, requests);
  EngineOptions o;
  o.block_size = 4;
  o.kv_blocks = 20;  // 80 token slots for 8 sequences of up to 69 tokens
  Engine engine(*model_, *tokenizer_, o);
  const auto together = run_together(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
  wait_idle(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_blocks_free + m.kv_blocks_cached, 20);
}

TEST_F(BatchingTest, CancelMidGenerationReturnsAllBlocks) {
  EngineOptions o;
  o.block_size = 4;
  Engine engine(*model_, *tokenizer_, o);
  const auto requests = mixed_requests(4, vocab(), 200);
  std::vector<std::promise<std::string>> done(requests.size());
  std::atomic<int> events{0};
  for (size_t i = 0; i < requests.size(); ++i)
    engine.submit(requests[i], [&, i](const GenerationEvent& ev) {
      if (++events == 12)
        for (RequestId id = 1; id <= requests.size(); ++id) engine.cancel(id);
      if (ev.finished) done[i].set_value(ev.finish_reason);
    });
  for (auto& d : done) EXPECT_EQ(d.get_future().get(), "cancelled");
  wait_idle(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_tokens_stored, 0);
  EXPECT_EQ(m.kv_blocks_free + m.kv_blocks_cached, m.kv_blocks_total);
}

TEST(PagedBatchingRealModel, SmolLM2ConcurrentGreedyEqualsAlone) {
  const std::string path = kvserve::test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the SmolLM2 model is not in models/";
  auto model = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  std::vector<GenerationRequest> requests;
  for (const char* text : {"The capital of France is", "Once upon a time, there was a", "1, 2, 3, 4,"})
    requests.push_back(greedy_request(tok.encode(text, tok.add_bos()), 8));
  const auto alone = run_alone(*model, tok, requests);
  EngineOptions o;
  o.max_batch_tokens = 8;
  o.kv_blocks = 64;
  Engine engine(*model, tok, o);
  const auto together = run_together(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
}
