// Continuous batching end to end: copy-on-write isolation and prefix reuse through the batched
// forward pass, and the Engine's outputs under concurrency, preemption and
// cancellation equal to each request run alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "kv/kv_cache_manager.h"
#include "model/synth.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"
#include "engine_run_util.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;
using kvserve::test_util::wait_idle;
using namespace kvserve::engine_run;

using BatchingTest = TinyModelTest;

// A forked sequence shares the parent's partial block; each side's next
// token goes through copy-on-write and gives the logits of a cold run.
TEST_F(BatchingTest, PagedCopyOnWriteIsolatesForkedSequences) {
  const ModelConfig& c = model_->config();
  KVCacheManager kv(16, 4, false);
  PagedKVStorage storage(c.n_layers, 16, 4, c.n_kv_heads, c.head_dim);
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
    PagedKVStorage cold_storage(c.n_layers, 16, 4, c.n_kv_heads, c.head_dim);
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
  std::vector<RequestId> ids(requests.size(), 0);
  std::atomic<bool> all_submitted{false};
  std::atomic<int> events{0};
  for (size_t i = 0; i < requests.size(); ++i) {
    // Counting only once every request is in: the engine may run the first ones while the rest are submitted.
    const auto id = engine.submit(requests[i], [&, i](const GenerationEvent& ev) {
      if (all_submitted && ++events == 12)
        for (RequestId each : ids) engine.cancel(each);
      if (ev.finished) done[i].set_value(ev.finish_reason);
    });
    ASSERT_TRUE(id.has_value());
    ids[i] = *id;
  }
  all_submitted = true;
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

// Quantized KV in the paged pool: concurrent requests (chunked prefill,
// prefix hits, copy-on-write) give the tokens each gives alone, q8_0 both ways.
TEST(PagedBatchingKVTypes, Q8_0ConcurrentGreedyEqualsAlone) {
  TempFile file(".gguf");
  ::kvserve::test_util::write_synth_model(file.path(), "tiny-hd32");
  auto model = Model::load(file.path());
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  const auto requests = mixed_requests(8, model->config().vocab_size, 20);
  const auto alone = run_alone(*model, tok, requests, 0, KVType::Q8_0);
  EngineOptions o;
  o.kv_type = KVType::Q8_0;
  o.max_running = 5;
  o.max_batch_tokens = 20;
  o.block_size = 4;
  Engine engine(*model, tok, o);
  const auto together = run_together(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
  EXPECT_GT(engine.metrics().prefix_hit_tokens, 0);
}

// forward_batch (one activation matrix for every sequence, fused Q/K/V and
// gate/up products, paged K/V) gives the logits of each sequence's own
// forward over a contiguous cache, for every weight type.
TEST(ForwardBatch, LogitsEqualPerSequenceForwardForEveryWeightType) {
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    TempFile file(".gguf");
    ::kvserve::test_util::write_synth_model(file.path(), "tiny-llama", type, 4);
    auto model = Model::load(file.path());
    const ModelConfig& c = model->config();
    const auto vocab = static_cast<size_t>(c.vocab_size);
    const std::vector<std::vector<int32_t>> prompts = {{5, 9, 13}, {7, 1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 20, 30}, {99}};
    KVCacheManager kv(64, 4, false);
    PagedKVStorage storage(c.n_layers, 64, 4, c.n_kv_heads, c.head_dim);
    std::vector<BlockCopy> copies;
    std::vector<SequenceChunk> chunks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(kv.allocate(i, 0, static_cast<int64_t>(prompts[i].size()), copies));
      chunks.push_back({prompts[i], 0, kv.blocks(i), true});
    }
    Transformer batched(*model, AttentionKernel::kFlash), single(*model, AttentionKernel::kFlash);
    std::vector<float> got(prompts.size() * vocab), want(vocab);
    batched.forward_batch(chunks, storage, got.data());
    for (size_t i = 0; i < prompts.size(); ++i) {
      ContiguousKVCache cache(c.n_layers, 32, c.n_kv_heads, c.head_dim);
      single.forward(prompts[i], cache, want.data());
      EXPECT_LT(kvserve::test_util::relative_error(std::span(got).subspan(i * vocab, vocab), want), 1e-5)
          << dtype_name(type) << " sequence " << i;
    }
  }
}
