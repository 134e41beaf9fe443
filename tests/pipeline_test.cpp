// Pipeline parallelism with in-process ranks (docs/scaling.md): stage
// models hold their slice of the layers; the engine over a pipeline of 2 and
// 3 ranks gives the tokens and log probabilities of one process with
// continuous batching, prefix caching, forks (copy-on-write) and speculation;
// the bytes a step sends equal the analytic count; a rank that never answers
// or holds another model fails with an error naming it, in time. The same
// over MPI processes: tests/mpi/.
#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <mutex>

#include "core/error.h"
#include "engine/engine.h"
#include "engine_run_util.h"
#include "kv/kv_cache_manager.h"
#include "parallel/pipeline_head.h"
#include "parallel/pipeline_messages.h"
#include "tokenizer/tokenizer.h"
#include "pipeline_util.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;
using kvserve::pipeline_test::LoopbackPipeline;
using kvserve::test_util::TempFile;

namespace {

EngineOptions small_pool() {
  EngineOptions o;
  o.block_size = 4;  // chunks cross blocks, forks copy partial blocks
  o.kv_blocks = 256;
  o.threads = 1;
  return o;
}

// Greedy requests (some sharing prefixes, some speculating) plus sampled forks, all with top-5 logprobs.
std::vector<GenerationRequest> workload(int64_t vocab) {
  std::vector<GenerationRequest> rs = mixed_requests(6, vocab, 10);
  std::vector<int32_t> cycle;
  for (int i = 0; i < 18; ++i) cycle.push_back(static_cast<int32_t>((i % 6) * 37 % vocab));
  GenerationRequest ngram = greedy_request(cycle, 10);
  ngram.speculation = {SpeculativeMode::kNgram, 4, false};
  rs.push_back(ngram);
  GenerationRequest forked = greedy_request({5, 6, 7, 8, 9, 10}, 8);
  forked.n = 3;
  forked.sampling.temperature = 1.0f;
  forked.sampling.seed = 42;
  rs.push_back(forked);
  for (GenerationRequest& r : rs) r.top_logprobs = 5;
  return rs;
}

// Every request at once; one Output per sequence (a request with n = 3 gives 3, in sequence order).
std::vector<Output> run_sequences(Engine& engine, const std::vector<GenerationRequest>& requests) {
  std::vector<std::vector<Output>> outs(requests.size());
  std::vector<int32_t> unfinished(requests.size());
  std::vector<std::promise<void>> done(requests.size());
  std::mutex mutex;
  for (size_t i = 0; i < requests.size(); ++i) {
    outs[i].resize(static_cast<size_t>(requests[i].n));
    unfinished[i] = requests[i].n;
    const auto id = engine.submit(requests[i], [&, i](const GenerationEvent& ev) {
      bool last = false;
      {
        std::lock_guard lock(mutex);
        Output& o = outs[i][static_cast<size_t>(ev.index)];
        o.tokens.insert(o.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        o.logprobs.insert(o.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
        if (!ev.finished) return;
        o.finish_reason = ev.finish_reason + (ev.error.empty() ? "" : ": " + ev.error);
        last = --unfinished[i] == 0;
      }
      // Only after the unlock: the waiter returns at set_value and takes `mutex` (on its stack) with it
      // (unlocking it after that aborted in glibc's priority-ceiling check, CI of 2026-12-04).
      if (last) done[i].set_value();
    });
    EXPECT_TRUE(id.has_value());
  }
  for (auto& d : done) d.get_future().wait();
  std::vector<Output> flat;
  for (const auto& sequences : outs) flat.insert(flat.end(), sequences.begin(), sequences.end());
  return flat;
}

void expect_same_outputs(const std::vector<Output>& got, const std::vector<Output>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "request " << i;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      const float a = got[i].logprobs[t].logprob, b = want[i].logprobs[t].logprob;
      EXPECT_LE(std::fabs(a - b), 1e-5 * std::max(1.0f, std::fabs(b))) << "request " << i << " token " << t;
    }
  }
}

class PipelineTest : public TinyModelTest {
 protected:
  std::vector<Output> one_process(const std::vector<GenerationRequest>& rs, EngineOptions o = small_pool()) {
    Engine engine(*model_, *tokenizer_, o);
    return run_sequences(engine, rs);
  }
};

TEST_F(PipelineTest, StagesHoldTheirSliceOfTheLayersAndAboutHalfTheWeights) {
  const auto a = Model::load(file_.path(), ModelLoadOptions{.pipeline_rank = 0, .pipeline_ranks = 2});
  const auto b = Model::load(file_.path(), ModelLoadOptions{.pipeline_rank = 1, .pipeline_ranks = 2});
  EXPECT_EQ(a->config().n_layers, 1);
  EXPECT_EQ(b->config().n_layers, 1);
  EXPECT_TRUE(a->embeds_tokens() && !a->has_output_head());
  EXPECT_TRUE(!b->embeds_tokens() && b->has_output_head());
  EXPECT_EQ(b->layer_range().first, 1);
  // tiny-llama has an untied head: the two stages together hold the whole model once.
  EXPECT_EQ(a->resident_weight_bytes() + b->resident_weight_bytes(), model_->resident_weight_bytes());
  EXPECT_THROW(Model::load(file_.path(), ModelLoadOptions{.pipeline_rank = 0, .pipeline_ranks = 3}), Error);
  EXPECT_THROW(Model::load(file_.path(), ModelLoadOptions{.max_layers = 1, .pipeline_rank = 0, .pipeline_ranks = 2}), Error);
}

TEST_F(PipelineTest, SlidingWindowLayersKeepTheirKindInEveryStage) {
  TempFile gemma(".gguf");
  test_util::write_synth_model(gemma.path(), "tiny-gemma3");  // 6 layers, five of six sliding
  const auto whole = Model::load(gemma.path());
  for (int r = 0; r < 3; ++r) {
    const auto stage = Model::load(gemma.path(), ModelLoadOptions{.pipeline_rank = r, .pipeline_ranks = 3});
    for (int64_t l = 0; l < stage->config().n_layers; ++l)
      EXPECT_EQ(stage->config().is_sliding(l), whole->config().is_sliding(2 * r + l)) << "rank " << r << " layer " << l;
  }
}

TEST_F(PipelineTest, TwoRanksGiveTheTokensAndLogprobsOfOneProcess) {
  const std::vector<GenerationRequest> rs = workload(vocab());
  const std::vector<Output> want = one_process(rs);
  LoopbackPipeline pipeline(file_.path(), 2);
  {
    Engine engine(pipeline.first_stage(), *tokenizer_, pipeline.engine_options(small_pool()));
    expect_same_outputs(run_sequences(engine, rs), want);
    // Again: now the prompts' full blocks come from the prefix cache, K/V computed on both ranks earlier.
    expect_same_outputs(run_sequences(engine, rs), want);
    EXPECT_GT(engine.metrics().prefix_hit_tokens, 0);
  }
  pipeline.finish();
  EXPECT_EQ(pipeline.error(1), "");
}

TEST_F(PipelineTest, ThreeRanksOnSlidingWindowLayersGiveTheOutputsOfOneProcess) {
  TempFile gemma(".gguf");
  test_util::write_synth_model(gemma.path(), "tiny-gemma3", DType::F32, 5);
  const auto whole = Model::load(gemma.path());
  const Tokenizer tok = Tokenizer::from_gguf(whole->file());
  const std::vector<GenerationRequest> rs = workload(whole->config().vocab_size);
  Engine reference(*whole, tok, small_pool());
  const std::vector<Output> want = run_sequences(reference, rs);
  LoopbackPipeline pipeline(gemma.path(), 3);
  {
    Engine engine(pipeline.first_stage(), tok, pipeline.engine_options(small_pool()));
    expect_same_outputs(run_sequences(engine, rs), want);
  }
  pipeline.finish();
}

// MLA and a mixture of experts (issue #35): each stage keeps its layers' latent
// rows (no V) and its dense or MoE blocks; three ranks of tiny-deepseek3's three blocks.
TEST_F(PipelineTest, ThreeRanksOnLatentAttentionAndExpertsGiveTheOutputsOfOneProcess) {
  TempFile mla(".gguf");
  test_util::write_synth_model(mla.path(), "tiny-deepseek3", DType::Q8_0, 5);
  const auto whole = Model::load(mla.path());
  const Tokenizer tok = Tokenizer::from_gguf(whole->file());
  const std::vector<GenerationRequest> rs = workload(whole->config().vocab_size);
  Engine reference(*whole, tok, small_pool());
  const std::vector<Output> want = run_sequences(reference, rs);
  LoopbackPipeline pipeline(mla.path(), 3);
  {
    Engine engine(pipeline.first_stage(), tok, pipeline.engine_options(small_pool()));
    expect_same_outputs(run_sequences(engine, rs), want);
  }
  pipeline.finish();
}

// Two engines one after the other over one pipeline (what bench --serving
// does): draft-model speculation, then auto speculation whose step cost is
// measured through the pipeline at start.
TEST_F(PipelineTest, DraftAndAutoSpeculationOnRankZeroGiveTheOutputsOfOneProcess) {
  const auto draft = Model::load(file_.path(), ModelLoadOptions{.max_layers = 1});
  std::vector<GenerationRequest> rs = mixed_requests(4, vocab(), 12);
  for (GenerationRequest& r : rs) r.speculation = {SpeculativeMode::kDraftModel, 3, false};
  EngineOptions o = small_pool();
  o.draft_model = draft.get();
  const std::vector<Output> want = one_process(rs, o);
  LoopbackPipeline pipeline(file_.path(), 2);
  {
    Engine engine(pipeline.first_stage(), *tokenizer_, pipeline.engine_options(o));
    expect_same_outputs(run_sequences(engine, rs), want);
    EXPECT_GT(engine.metrics().spec_rounds, 0);
  }
  for (GenerationRequest& r : rs) r.speculation = {SpeculativeMode::kAuto, 3, false};
  o.measure_step_cost = true;
  {
    Engine engine(pipeline.first_stage(), *tokenizer_, pipeline.engine_options(o));
    EXPECT_FALSE(engine.step_cost_at_start().empty());
    expect_same_outputs(run_sequences(engine, rs), want);
  }
  pipeline.finish();
  EXPECT_EQ(pipeline.error(1), "");
}

// Step 1: a 6-token prompt; fork; step 2: one token on each side after a
// copy-on-write copy. Rank 0 sends the plan + activations, rank 1 the logits.
TEST_F(PipelineTest, BytesSentPerStepEqualTheAnalyticCount) {
  const ModelConfig& c = model_->config();
  LoopbackPipeline pipeline(file_.path(), 2);
  {
    const KVPoolShape pool{16, 4, KVType::F32};
    const auto head = make_pipeline_head(pipeline.first_stage(), pool, pipeline.options());
    const uint64_t setup_bytes = pipeline.comm(0).bytes_sent();
    EXPECT_EQ(setup_bytes, sizeof(PipelineSetup));
    KVCacheManager kv(16, 4, false);
    std::vector<BlockCopy> copies;
    const std::vector<int32_t> prompt = {11, 22, 33, 44, 55, 66};
    std::vector<float> logits(static_cast<size_t>(2 * vocab()));
    ASSERT_TRUE(kv.allocate(1, 0, 6, copies));
    const SequenceChunk pre{prompt, 0, kv.blocks(1), true};
    head->forward_batch(std::span(&pre, 1), logits.data());
    // kind, copy count, chunk count; per chunk 4 words + its table; the activations.
    const auto word = sizeof(int64_t), id = sizeof(BlockId), f32 = sizeof(float);
    const auto dim = static_cast<size_t>(c.dim), V = static_cast<size_t>(vocab());
    EXPECT_EQ(pipeline.comm(0).bytes_sent() - setup_bytes, 3 * word + (4 * word + 2 * id) + 6 * dim * f32);
    EXPECT_EQ(pipeline.comm(1).bytes_sent(), word /* ready */ + word + 1 * V * f32);
    kv.fork(1, 2);
    ASSERT_TRUE(kv.allocate(1, 6, 7, copies));
    ASSERT_TRUE(kv.allocate(2, 6, 7, copies));
    ASSERT_EQ(copies.size(), 1u);
    for (const BlockCopy& bc : copies) head->copy_block(bc.src, bc.dst);
    const std::vector<int32_t> a = {77}, b = {88};
    const std::vector<SequenceChunk> step = {{a, 6, kv.blocks(1), true}, {b, 6, kv.blocks(2), true}};
    const uint64_t before0 = pipeline.comm(0).bytes_sent(), before1 = pipeline.comm(1).bytes_sent();
    head->forward_batch(step, logits.data());
    EXPECT_EQ(pipeline.comm(0).bytes_sent() - before0, 3 * word + 2 * id + 2 * (4 * word + 2 * id) + 2 * dim * f32);
    EXPECT_EQ(pipeline.comm(1).bytes_sent() - before1, word + 2 * V * f32);
  }
  pipeline.finish();
}

TEST_F(PipelineTest, ARankThatNeverAnswersFailsTheStepWithItsNameInTime) {
  LoopbackGroup group(2);  // rank 1 never runs its stage
  const auto first = Model::load(file_.path(), ModelLoadOptions{.pipeline_rank = 0, .pipeline_ranks = 2});
  const PipelineOptions options{&group.rank(0), std::chrono::milliseconds(200), nullptr};
  try {
    make_pipeline_head(*first, {16, 4, KVType::F32}, options);
    FAIL() << "the setup went through without rank 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("within 200 ms"), std::string::npos) << e.what();
  }
}

TEST_F(PipelineTest, ARankLostMidRunFailsTheRequestsAndEveryLaterStep) {
  LoopbackGroup group(2);
  const auto first = Model::load(file_.path(), ModelLoadOptions{.pipeline_rank = 0, .pipeline_ranks = 2});
  // A fake rank 1 that answers the setup, then disappears.
  std::thread fake([&] {
    std::vector<std::byte> bytes;
    group.rank(1).broadcast(0, bytes, std::chrono::seconds(10));
    std::vector<std::byte> ready;
    encode_logits_reply({}, ready);
    group.rank(1).send(0, kPipelineReplyTag, ready, std::chrono::seconds(10));
  });
  std::string failure;
  EngineOptions o = small_pool();
  o.pipeline = {&group.rank(0), std::chrono::milliseconds(200), [&](const std::string& e) { failure = e; }};
  {
    Engine engine(*first, *tokenizer_, o);
    fake.join();
    const Output out = run_together(engine, {greedy_request({1, 2, 3}, 4)})[0];
    EXPECT_EQ(out.finish_reason, "error");
    EXPECT_NE(failure.find("rank 0 received nothing from any rank within 200 ms"), std::string::npos) << failure;
    EXPECT_EQ(run_together(engine, {greedy_request({4, 5}, 2)})[0].finish_reason, "error");
  }
}

TEST_F(PipelineTest, ARankWithAnotherModelIsRefusedAtSetupNamingTheDifference) {
  TempFile other(".gguf");
  test_util::write_synth_model(other.path(), "tiny-qwen2");
  LoopbackGroup group(2);
  const auto first = Model::load(file_.path(), ModelLoadOptions{.pipeline_rank = 0, .pipeline_ranks = 2});
  const auto wrong = Model::load(other.path(), ModelLoadOptions{.pipeline_rank = 1, .pipeline_ranks = 2});
  std::string stage_error;
  std::thread stage([&] {
    try {
      run_pipeline_stage(*wrong, group.rank(1), std::chrono::seconds(10));
    } catch (const Error& e) {
      stage_error = e.what();
    }
  });
  try {
    make_pipeline_head(*first, {16, 4, KVType::F32}, {&group.rank(0), std::chrono::seconds(10), nullptr});
    ADD_FAILURE() << "a stage of another model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab 320 vs 384"), std::string::npos) << e.what();
  }
  stage.join();
  EXPECT_NE(stage_error.find("differ from rank 0's"), std::string::npos) << stage_error;
}

TEST(PipelineMessages, MalformedStepsAreRefused) {
  std::vector<std::byte> bytes;
  const std::vector<int32_t> tokens = {1, 2};
  const std::vector<BlockId> table = {0};
  const SequenceChunk chunk{tokens, 0, table, true, 1};
  const std::vector<float> activations(2 * 8, 1.0f);
  encode_step({}, std::span(&chunk, 1), activations, bytes);
  const StepLimits limits{8, 16, 4};
  const StepMessage m = decode_step(bytes, limits);
  EXPECT_EQ(m.n_tokens(), 2);
  EXPECT_EQ(m.activations, activations);
  EXPECT_THROW(decode_step(bytes, StepLimits{4, 16, 4}), Error);  // activations of another width
  bytes.resize(bytes.size() - 1);
  EXPECT_THROW(decode_step(bytes, limits), Error);
  bytes.resize(5);
  EXPECT_THROW(decode_step(bytes, limits), Error);
  EXPECT_TRUE(decode_step(encode_shutdown(), limits).shutdown);
}

TEST(PipelineRealModel, SmolLM2TwoRanksGiveTheOutputsOfOneProcess) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow unoptimized";
  const std::string path = test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the SmolLM2 model is not in models/";
  const auto whole = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(whole->file());
  std::vector<GenerationRequest> rs;
  for (const char* p : {"Once upon a time", "The capital of France is", "Once upon a time, in a land"}) {
    GenerationRequest r = greedy_request(tok.encode(p, tok.add_bos()), 8);
    r.top_logprobs = 3;
    rs.push_back(r);
  }
  EngineOptions o;
  o.threads = 2;
  Engine reference(*whole, tok, o);
  const std::vector<Output> want = run_sequences(reference, rs);
  LoopbackPipeline pipeline(path, 2);
  EXPECT_LT(pipeline.stage(0).resident_weight_bytes(), whole->resident_weight_bytes() * 6 / 10);
  EXPECT_LT(pipeline.stage(1).resident_weight_bytes(), whole->resident_weight_bytes() * 6 / 10);
  {
    Engine engine(pipeline.first_stage(), tok, pipeline.engine_options(o));
    expect_same_outputs(run_sequences(engine, rs), want);
  }
  pipeline.finish();
}

TEST(PipelineCli, PipelineParallelWithoutMpirunOrMpiIsRefusedWithWhatToDo) {
  TempFile file(".gguf");
  test_util::write_synth_model(file.path(), "tiny-llama");
  const auto r = test_util::run_kvserve("run -m " + file.path() + " -p hi -n 2 --pipeline-parallel 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const bool explained = r.output.find("mpirun -np 2") != std::string::npos ||
                         r.output.find("-DKVSERVE_MPI=ON") != std::string::npos;
  EXPECT_TRUE(explained) << r.output;
}

}  // namespace
