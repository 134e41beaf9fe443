// Pipeline parallelism across MPI processes (run by ctest as `mpirun -np 2
// kvserve_mpi_tests`, one OpenMP thread each; docs/scaling.md): every test
// runs on both ranks in the same order; rank 0 drives an engine (or a
// pipeline head) and checks it against one process holding the whole model,
// rank 1 runs its stage until rank 0 ends the pipeline. On the tiny and the
// default model: greedy tokens identical, log probabilities and logits within
// 1e-5 relative, each rank's weights about half, bytes per step equal to the
// analytic count. A rank killed or stopped is checked on whole processes by
// pipeline_failure_test.py.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "engine/engine.h"
#include "engine_run_util.h"
#include "kv/kv_cache_manager.h"
#include "parallel/model_runner.h"
#include "parallel/mpi_communicator.h"
#include "parallel/pipeline_head.h"
#include "parallel/pipeline_messages.h"
#include "parallel/pipeline_stage.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;

namespace {

Communicator* world = nullptr;  // set by main() for the whole run: MPI starts once per process
constexpr std::chrono::milliseconds kTimeout{30000};

ModelLoadOptions stage_of(int rank) { return {.pipeline_rank = rank, .pipeline_ranks = world->size()}; }

// Rank 0's reference and pipelined outputs of `requests` over the model at `path`; the other ranks serve their stage.
void expect_pipeline_equals_one_process(const std::string& path, const std::vector<GenerationRequest>& requests,
                                        EngineOptions options) {
  options.threads = 1;  // the engine thread's own OpenMP team (main's setting does not reach it)
  const auto whole = Model::load(path);
  const auto stage = Model::load(path, stage_of(world->rank()));
  // Each rank holds about its share: the layers split evenly, plus the embedding or the head.
  EXPECT_LT(stage->resident_weight_bytes(), whole->resident_weight_bytes() * 7 / 10) << "rank " << world->rank();
  if (world->rank() != 0) {
    run_pipeline_stage(*stage, *world, kTimeout);
    return;
  }
  const Tokenizer tok = Tokenizer::from_gguf(whole->file());
  std::vector<Output> want, got;
  {
    Engine reference(*whole, tok, options);
    want = run_together(reference, requests);
  }
  options.pipeline = {world, kTimeout, nullptr};
  {
    Engine engine(*stage, tok, options);
    got = run_together(engine, requests);
  }
  end_pipeline(*world, kTimeout);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      for (size_t k = 0; k < got[i].logprobs[t].top.size(); ++k) {
        const float a = got[i].logprobs[t].top[k].second, b = want[i].logprobs[t].top[k].second;
        EXPECT_LE(std::fabs(a - b), 1e-5 * std::max(1.0f, std::fabs(b))) << "request " << i << " token " << t;
      }
    }
  }
}

std::vector<GenerationRequest> with_logprobs(std::vector<GenerationRequest> rs) {
  for (GenerationRequest& r : rs) r.top_logprobs = 5;
  return rs;
}

TEST(PipelineMpi, TinyModelGivesTheOutputsOfOneProcess) {
  test_util::TempFile file(".gguf");  // each rank writes the same deterministic file
  test_util::write_synth_model(file.path(), "tiny-llama", DType::F32, 3);
  EngineOptions o;
  o.block_size = 4;
  o.kv_blocks = 256;
  std::vector<GenerationRequest> rs = mixed_requests(6, 320, 10);
  for (uint64_t seed : {7, 8}) {  // sampled: equal only if every logit is
    GenerationRequest sampled = greedy_request({5, 6, 7, 8, 9, 10}, 8);
    sampled.sampling.temperature = 1.0f;
    sampled.sampling.seed = seed;
    rs.push_back(sampled);
  }
  GenerationRequest ngram = greedy_request({1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2}, 10);
  ngram.speculation = {SpeculativeMode::kNgram, 4, false};
  rs.push_back(ngram);
  expect_pipeline_equals_one_process(file.path(), with_logprobs(rs), o);
}

TEST(PipelineMpi, DefaultModelGivesTheOutputsOfOneProcess) {
  const std::string path = test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the SmolLM2 model is not in models/";  // the same on every rank
  const auto probe = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(probe->file());
  std::vector<GenerationRequest> rs;
  for (const char* p : {"Once upon a time", "The capital of France is", "Once upon a time, in a land far away"})
    rs.push_back(greedy_request(tok.encode(p, tok.add_bos()), 16));
  expect_pipeline_equals_one_process(path, with_logprobs(rs), EngineOptions{});
}

// A 6-token prompt, then one token on each side of a fork (a copy-on-write
// copy), through `runner`; returns both steps' logits ([1 + 2][vocab]).
// `sent` gets what `comm` counted for each step (null: not counted).
std::vector<float> two_steps(ModelRunner& runner, int64_t vocab, Communicator* comm, uint64_t sent[2]) {
  KVCacheManager kv(16, 4, false);
  std::vector<BlockCopy> copies;
  const std::vector<int32_t> prompt = {11, 22, 33, 44, 55, 66}, a = {77}, b = {88};
  std::vector<float> logits(static_cast<size_t>(3 * vocab));
  EXPECT_TRUE(kv.allocate(1, 0, 6, copies));
  const SequenceChunk pre{prompt, 0, kv.blocks(1), true};
  uint64_t before = comm ? comm->bytes_sent() : 0;
  runner.forward_batch(std::span(&pre, 1), logits.data());
  if (comm) sent[0] = comm->bytes_sent() - before;
  kv.fork(1, 2);
  EXPECT_TRUE(kv.allocate(1, 6, 7, copies));
  EXPECT_TRUE(kv.allocate(2, 6, 7, copies));
  EXPECT_EQ(copies.size(), 1u);
  for (const BlockCopy& bc : copies) runner.copy_block(bc.src, bc.dst);
  const std::vector<SequenceChunk> step = {{a, 6, kv.blocks(1), true}, {b, 6, kv.blocks(2), true}};
  before = comm ? comm->bytes_sent() : 0;
  runner.forward_batch(step, logits.data() + vocab);
  if (comm) sent[1] = comm->bytes_sent() - before;
  return logits;
}

// Rank 0: the pipeline's logits against one process's, and the bytes of each
// step against the analytic count; the last rank: the logits bytes it sent.
void expect_logits_and_bytes(const std::string& path) {
  const auto stage = Model::load(path, stage_of(world->rank()));
  const auto word = sizeof(int64_t), id = sizeof(BlockId), f32 = sizeof(float);
  const auto dim = static_cast<size_t>(stage->config().dim), V = static_cast<size_t>(stage->config().vocab_size);
  const uint64_t start = world->bytes_sent();
  if (world->rank() != 0) {
    run_pipeline_stage(*stage, *world, kTimeout);
    if (world->rank() == world->size() - 1) {
      EXPECT_EQ(world->bytes_sent() - start, word + (word + V * f32) + (word + 2 * V * f32));
    }
    return;
  }
  const KVPoolShape pool{16, 4, KVType::F32};
  auto head = make_pipeline_head(*stage, pool, {world, kTimeout, nullptr});
  EXPECT_EQ(world->bytes_sent() - start, sizeof(PipelineSetup) * static_cast<size_t>(world->size() - 1));
  uint64_t sent[2] = {};
  const std::vector<float> got = two_steps(*head, static_cast<int64_t>(V), world, sent);
  head.reset();
  end_pipeline(*world, kTimeout);
  // Plan (kind, copy count, chunk count; per chunk 4 words + its table; the copies) + activations.
  EXPECT_EQ(sent[0], 3 * word + (4 * word + 2 * id) + 6 * dim * f32);
  EXPECT_EQ(sent[1], 3 * word + 2 * id + 2 * (4 * word + 2 * id) + 2 * dim * f32);
  const auto whole = Model::load(path);
  const auto local = make_local_runner(*whole, pool);
  const std::vector<float> want = two_steps(*local, static_cast<int64_t>(V), nullptr, sent);
  EXPECT_LE(test_util::relative_error(got, want), 1e-5);
}

TEST(PipelineMpi, TinyModelLogitsAndBytesPerStep) {
  test_util::TempFile file(".gguf");
  test_util::write_synth_model(file.path(), "tiny-llama", DType::F32, 3);
  expect_logits_and_bytes(file.path());
}

TEST(PipelineMpi, DefaultModelLogitsAndBytesPerStep) {
  const std::string path = test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the SmolLM2 model is not in models/";
  expect_logits_and_bytes(path);
}

}  // namespace

int main(int argc, char** argv) {
  if (!started_by_mpirun()) {
    std::fprintf(stderr, "skipped: run under mpirun -np 2\n");
    return 77;
  }
  omp_set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  MpiCommunicator comm;
  world = &comm;
  // Only rank 0 prints gtest's report; a failure on any rank fails mpirun.
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (comm.rank() != 0) delete listeners.Release(listeners.default_result_printer());
  const int failed = RUN_ALL_TESTS();
  world = nullptr;
  return failed;
}
