// Speculative decoding inside the batching engine: the scheduler's draft
// budget, rollback and prefix publishing (no model); greedy outputs with
// n-gram drafts and with a draft model equal to those without, alone,
// concurrent, under preemption, cut by max_tokens and stop strings;
// cancellation; the target as its own draft accepting everything; refusals;
// the sampled distribution (chi-square); the real SmolLM2 and Qwen2.5-Coder.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "engine_run_util.h"
#include "spec_stats.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::wait_idle;
using namespace kvserve::engine_run;

namespace {

GenerationRequest with_spec(GenerationRequest r, int64_t k, bool adaptive = false) {
  r.speculation = {SpeculativeMode::kNgram, k, adaptive};
  return r;
}

GenerationRequest with_auto(GenerationRequest r, int64_t k) {
  r.speculation = {SpeculativeMode::kAuto, k, false};
  return r;
}

// Step costs for auto mode: drafts free (every step costs the same), or a
// step costing in proportion to its tokens (drafting never pays).
const std::vector<std::pair<int64_t, double>> kFlatStepCost = {{1, 1.0}, {64, 1.0}};
const std::vector<std::pair<int64_t, double>> kLinearStepCost = {{1, 1.0}, {2, 2.0}};

GenerationRequest with_draft(GenerationRequest r, int64_t k, bool adaptive = false) {
  r.speculation = {SpeculativeMode::kDraftModel, k, adaptive};
  return r;
}

// `period` tokens repeated `repeats` times: prompt lookup finds its drafts.
std::vector<int32_t> cycle_prompt(int64_t period, int64_t repeats, int64_t vocab, int64_t salt) {
  std::vector<int32_t> p;
  for (int64_t r = 0; r < repeats; ++r)
    for (int64_t i = 0; i < period; ++i) p.push_back(static_cast<int32_t>((i * 53 + salt * 7 + 1) % vocab));
  return p;
}

// Four repetitive prompts and four of the batching tests' mixed ones, greedy.
std::vector<GenerationRequest> workload(int64_t vocab, int64_t max_tokens) {
  std::vector<GenerationRequest> rs;
  for (int64_t i = 0; i < 4; ++i) rs.push_back(greedy_request(cycle_prompt(5 + i, 4, vocab, i), max_tokens));
  for (const GenerationRequest& r : mixed_requests(4, vocab, max_tokens)) rs.push_back(r);
  return rs;
}

void expect_pool_idle(const Engine& engine) {
  wait_idle(engine);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.running + m.waiting, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
  EXPECT_EQ(m.kv_tokens_stored, 0);
  EXPECT_EQ(m.kv_blocks_free + m.kv_blocks_cached, m.kv_blocks_total);
  EXPECT_EQ(m.draft_kv_blocks_used, 0);  // the draft model's pool too
}

void expect_same(const std::vector<Output>& got, const std::vector<Output>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    EXPECT_EQ(got[i].text, want[i].text) << what << ", request " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << what << ", request " << i;
  }
}

// Rounds cut short: with max_tokens 1..12 and with stop strings taken from
// `full` (base's output without speculation), speculation in `mode` gives the
// same tokens and text as plain decoding.
void expect_rounds_end_mid_way(Engine& engine, const GenerationRequest& base, const Output& full,
                               SpeculativeMode mode) {
  const auto speculative = [mode](GenerationRequest r) {
    r.speculation = {mode, 8, false};
    return r;
  };
  for (int64_t n = 1; n <= 12; ++n) {
    GenerationRequest r = speculative(base);
    r.max_tokens = n;
    const Output got = run_together(engine, {r})[0];
    ASSERT_EQ(got.tokens.size(), static_cast<size_t>(n));  // never past max_tokens
    EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), full.tokens.begin())) << "max_tokens " << n;
    EXPECT_EQ(got.finish_reason, "length");
  }
  for (size_t pos = 2; pos + 2 < full.text.size() && pos < 40; pos += 5) {
    GenerationRequest plain = base;
    plain.stop = {full.text.substr(pos, 2)};
    const Output want = run_together(engine, {plain})[0];
    expect_same({run_together(engine, {speculative(plain)})[0]}, {want}, "stop at " + std::to_string(pos));
  }
}

class EngineSpeculation : public TinyModelTest {
 protected:
  static EngineOptions small_blocks() {
    EngineOptions o;
    o.block_size = 4;  // drafts cross block boundaries, rollback frees blocks
    o.threads = 1;     // a tiny model's steps are OpenMP barriers on a busy machine
    return o;
  }
  // The second generated token of `draws` sampled requests (temperature 1, no
  // truncation) speculating in `mode`; returns its histogram.
  std::vector<int64_t> second_token_counts(Engine& engine, const std::vector<int32_t>& prompt,
                                           const SamplingParams& params, SpeculativeMode mode, int draws) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < draws; ++i) {
      GenerationRequest r = greedy_request(prompt, 3);  // 3: the second token may come with a draft
      r.speculation = {mode, 3, false};
      r.sampling = params;
      r.sampling.seed = 1000 + static_cast<uint64_t>(i);
      requests.push_back(r);
    }
    std::vector<int64_t> counts(static_cast<size_t>(vocab()));
    for (const Output& out : run_together(engine, requests)) counts[static_cast<size_t>(out.tokens.at(1))] += 1;
    return counts;
  }
  static SamplingParams untruncated() {
    SamplingParams params;
    params.temperature = 1.0f;
    params.top_k = 0;
    params.top_p = 1.0f;
    params.min_p = 0.0f;
    return params;
  }
};

// The engine with a draft model: the target's first layer (tiny-llama has 2).
class EngineDraftModel : public EngineSpeculation {
 protected:
  void SetUp() override {
    EngineSpeculation::SetUp();
    draft_ = Model::load(file_.path(), ModelLoadOptions{.max_layers = 1});
  }
  EngineOptions with_draft_model(EngineOptions o) const {
    o.draft_model = draft_.get();
    return o;
  }
  std::unique_ptr<Model> draft_;
};

// Scheduler with a pool of `blocks` blocks of 4 tokens, no model.
struct SchedulerBench {
  explicit SchedulerBench(int64_t blocks, int64_t budget) : kv(blocks, 4, true), scheduler({8, budget}, kv) {}
  Sequence* add(SequenceId id, std::vector<int32_t> prompt) {
    auto seq = std::make_unique<Sequence>();
    seq->id = id;
    seq->tokens = std::move(prompt);
    seq->prompt_len = seq->num_tokens();
    seq->max_kv_tokens = 1000;
    Sequence* raw = seq.get();
    scheduler.add(std::move(seq));
    return raw;
  }
  KVCacheManager kv;
  Scheduler scheduler;
};

}  // namespace

TEST(SchedulerSpeculation, DraftsTakeOnlyTheBudgetLeftAfterOneTokenPerLaterSequence) {
  SchedulerBench b(64, 10);
  std::vector<Sequence*> seqs;
  for (SequenceId id = 1; id <= 3; ++id) seqs.push_back(b.add(id, {1, 2}));
  int calls = 0;
  const std::vector<int32_t> pool_of_drafts = {7, 8, 9, 10, 11, 12, 13, 14, 15};
  const DraftSource drafts = [&](const Sequence& seq, int64_t max_drafts, int64_t) {
    ++calls;
    EXPECT_EQ(seq.num_uncomputed(), 1);
    return std::span<const int32_t>(pool_of_drafts).first(static_cast<size_t>(max_drafts));
  };
  b.scheduler.finish_step(b.scheduler.schedule(drafts));  // prefill: no drafts offered
  EXPECT_EQ(calls, 0);
  for (Sequence* s : seqs) s->tokens.push_back(5);  // each sampled a token
  const SchedulerOutput out = b.scheduler.schedule(drafts);
  ASSERT_EQ(out.chunks.size(), 3u);
  EXPECT_EQ(out.chunks[0].n_draft, 7);  // 10 - its own token - one for each of the two later sequences
  EXPECT_EQ(out.chunks[0].n, 8);
  EXPECT_TRUE(out.chunks[0].samples);
  EXPECT_EQ(out.chunks[1].n_draft + out.chunks[2].n_draft, 0);
  EXPECT_EQ(out.num_tokens(), 10);
  EXPECT_EQ(seqs[0]->num_tokens(), 3 + 7);
  EXPECT_EQ(b.kv.blocks(1).size(), 3u);  // positions 0..9
  b.scheduler.finish_step(out);
  EXPECT_FALSE(b.kv.pool().is_hashed(b.kv.blocks(1)[0]));  // its 4 tokens include a draft: not final yet
  b.scheduler.resolve_drafts(*seqs[0], 2);
  EXPECT_EQ(seqs[0]->tokens, (std::vector<int32_t>{1, 2, 5, 7, 8}));
  EXPECT_EQ(seqs[0]->num_computed, 5);
  EXPECT_EQ(seqs[0]->num_draft, 0);
  ASSERT_EQ(b.kv.blocks(1).size(), 2u);  // the third block went back to the pool
  EXPECT_TRUE(b.kv.pool().is_hashed(b.kv.blocks(1)[0]));
  EXPECT_FALSE(b.kv.pool().is_hashed(b.kv.blocks(1)[1]));
  b.kv.check_integrity();
  for (SequenceId id = 1; id <= 3; ++id) b.scheduler.remove(id);
  EXPECT_EQ(b.kv.pool().used(), 0);
  EXPECT_EQ(b.kv.pool().free() + b.kv.pool().cached(), 64);
}

TEST(SchedulerSpeculation, DraftsNeverTakeBlocksOthersNeedNorPreempt) {
  SchedulerBench b(2, 64);
  std::vector<Sequence*> seqs = {b.add(1, {1, 2, 3}), b.add(2, {4, 5, 6})};
  b.scheduler.finish_step(b.scheduler.schedule());
  for (Sequence* s : seqs) s->tokens.push_back(9);
  const std::vector<int32_t> proposal = {1, 2, 3};
  const SchedulerOutput out = b.scheduler.schedule([&](const Sequence&, int64_t max_drafts, int64_t) {
    return std::span<const int32_t>(proposal).first(static_cast<size_t>(std::min<int64_t>(3, max_drafts)));
  });
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.chunks.size(), 2u);
  for (const ScheduledChunk& c : out.chunks) EXPECT_EQ(c.n_draft, 0);  // the pool is full
  b.kv.check_integrity();
}

TEST_F(EngineSpeculation, GreedyAloneEqualsWithoutForEveryK) {
  const auto requests = workload(vocab(), 24);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  Engine engine(*model_, *tokenizer_, small_blocks());
  for (const auto& [k, adaptive] : std::vector<std::pair<int64_t, bool>>{{1, false}, {4, false}, {8, true}}) {
    std::vector<Output> spec;
    for (const GenerationRequest& r : requests) spec.push_back(run_together(engine, {with_spec(r, k, adaptive)})[0]);
    expect_same(spec, plain, "k " + std::to_string(k));
  }
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.spec_rounds, 0);
  EXPECT_GT(m.spec_accepted_tokens, 0);  // the repetitive prompts make drafts hit
  EXPECT_LE(m.spec_accepted_tokens, m.spec_draft_tokens);
  expect_pool_idle(engine);
}

TEST_F(EngineSpeculation, EightConcurrentMixedRequestsEqualEachRunAlone) {
  auto requests = workload(vocab(), 24);
  requests[2].sampling.repetition_penalty = 1.3f;  // penalties see the accepted drafts
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  std::vector<GenerationRequest> mixed = requests;
  for (size_t i = 0; i < mixed.size(); i += 2) mixed[i] = with_spec(mixed[i], 4);
  for (size_t i = 1; i < mixed.size(); i += 4) mixed[i] = with_spec(mixed[i], 6, true);
  EngineOptions o = small_blocks();
  o.max_batch_tokens = 16;  // the budget, not k, limits the drafts
  Engine engine(*model_, *tokenizer_, o);
  expect_same(run_together(engine, mixed), plain, "concurrent");
  EXPECT_GT(engine.metrics().spec_accepted_tokens, 0);
  expect_pool_idle(engine);
  // Continue every sequence from its output: prefix hits on blocks published
  // during speculation must hold the K/V of the final tokens.
  std::vector<GenerationRequest> more = requests;
  for (size_t i = 0; i < more.size(); ++i) {
    more[i].prompt.insert(more[i].prompt.end(), plain[i].tokens.begin(), plain[i].tokens.end());
    more[i].max_tokens = 8;
  }
  const auto more_plain = run_alone(*model_, *tokenizer_, more);
  for (size_t i = 0; i < more.size(); i += 2) more[i] = with_spec(more[i], 4);
  const int64_t hits = engine.metrics().prefix_hit_tokens;
  expect_same(run_together(engine, more), more_plain, "continued");
  EXPECT_GT(engine.metrics().prefix_hit_tokens, hits);
  expect_pool_idle(engine);
}

TEST_F(EngineSpeculation, PreemptionUnderATinyPoolGivesIdenticalOutputs) {
  auto requests = workload(vocab(), 30);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  for (GenerationRequest& r : requests) r = with_spec(r, 4);
  EngineOptions o = small_blocks();
  o.kv_blocks = 24;  // 96 token slots for 8 sequences of up to 58 tokens
  Engine engine(*model_, *tokenizer_, o);
  expect_same(run_together(engine, requests), plain, "tiny pool");
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.preemptions, 0);
  EXPECT_GT(m.spec_rounds, 0);
  expect_pool_idle(engine);
}

TEST_F(EngineSpeculation, MaxTokensAndStopStringsCutInsideAcceptedRuns) {
  Engine engine(*model_, *tokenizer_, small_blocks());
  const GenerationRequest base = greedy_request(cycle_prompt(6, 4, vocab(), 1), 20);
  const Output full = run_together(engine, {base})[0];
  expect_rounds_end_mid_way(engine, base, full, SpeculativeMode::kNgram);
  EXPECT_GT(engine.metrics().spec_accepted_tokens, 0);
  expect_pool_idle(engine);
}

TEST_F(EngineSpeculation, CancelMidSpeculationReturnsAllBlocks) {
  Engine engine(*model_, *tokenizer_, small_blocks());
  auto requests = workload(vocab(), 200);
  std::vector<std::promise<std::string>> done(requests.size());
  std::vector<RequestId> ids(requests.size(), 0);
  std::atomic<bool> all_submitted{false};
  std::atomic<bool> cancelled{false};
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto id = engine.submit(with_spec(requests[i], 4), [&, i](const GenerationEvent& ev) {
      // At the first event carrying accepted drafts once every request is in (the engine may run the first
      // requests' rounds while later ones are still being submitted: cancelling then missed those).
      if (ev.tokens.size() > 1 && all_submitted && !cancelled.exchange(true))
        for (RequestId each : ids) engine.cancel(each);
      if (ev.finished) done[i].set_value(ev.finish_reason);
    });
    ASSERT_TRUE(id.has_value());
    ids[i] = *id;
  }
  all_submitted = true;
  for (auto& d : done) EXPECT_EQ(d.get_future().get(), "cancelled");
  EXPECT_TRUE(cancelled.load());
  EXPECT_GT(engine.metrics().spec_rounds, 0);
  expect_pool_idle(engine);
}

TEST_F(EngineSpeculation, RefusesDraftModeWithoutADraftModelAndOutOfRangeK) {
  Engine engine(*model_, *tokenizer_, {});
  GenerationRequest r = greedy_request({1, 2, 3}, 4);
  r.speculation.mode = SpeculativeMode::kDraftModel;
  try {
    engine.submit(r, [](const GenerationEvent&) {});
    FAIL() << "draft-model speculation without a draft model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("speculative mode 'draft' needs a draft model: start the server with --draft FILE"),
              std::string::npos)
        << e.what();
  }
  for (int64_t k : {0, 33}) EXPECT_THROW(engine.submit(with_spec(r, k), [](const GenerationEvent&) {}), Error);
}

// Auto mode: whatever it chooses, greedy output is the target's; with free
// drafts it speculates and its drafts hit on the repetitive prompts, with
// steps costing in proportion to their tokens it never drafts, and with the
// cost it measures itself (start of the engine) it runs either way.
TEST_F(EngineSpeculation, AutoGreedyEqualsWithoutWhateverTheStepCost) {
  const auto requests = workload(vocab(), 24);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  for (const auto& [name, cost] : std::vector<std::pair<std::string, std::vector<std::pair<int64_t, double>>>>{
           {"free drafts", kFlatStepCost}, {"linear cost", kLinearStepCost}, {"measured", {}}}) {
    EngineOptions o = small_blocks();
    o.step_cost = cost;
    o.max_batch_tokens = 24;  // concurrent requests compete for the budget
    Engine engine(*model_, *tokenizer_, o);
    std::vector<GenerationRequest> spec;
    for (const GenerationRequest& r : requests) spec.push_back(with_auto(r, 6));
    expect_same(run_together(engine, spec), plain, name + ", concurrent");
    for (size_t i = 0; i < 2; ++i) expect_same({run_together(engine, {spec[i]})[0]}, {plain[i]}, name + ", alone");
    const EngineMetrics m = engine.metrics();
    if (name == "free drafts") {
      EXPECT_GT(m.spec_rounds, 0);
      EXPECT_GT(m.spec_accepted_tokens, 0);
    }
    if (name == "linear cost") {
      EXPECT_EQ(m.spec_rounds, 0);
    }
    expect_pool_idle(engine);
  }
}

TEST_F(EngineSpeculation, AutoRefusesAStepCostItCannotUse) {
  EngineOptions o = small_blocks();
  o.step_cost = {{0, 1.0}};
  EXPECT_THROW(Engine(*model_, *tokenizer_, o), Error);
  o.step_cost = {{1, -1.0}};
  EXPECT_THROW(Engine(*model_, *tokenizer_, o), Error);
}

// Sampling: the second token (the first one a verification produces) of many
// speculative requests follows the exact marginal sum_t p(t) p(. | t).
TEST_F(EngineSpeculation, SampledTokensKeepTheTargetsDistribution) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow unoptimized";
  spec_stats::SingleThreaded single_threaded;  // the exact distributions; the engine has its own option
  std::vector<int32_t> prompt;  // 200 distinct tokens: most first tokens recur in it, so drafts follow
  for (int32_t i = 0; i < 200; ++i) prompt.push_back((i * 7 + 3) % static_cast<int32_t>(vocab()));
  const SamplingParams params = untruncated();
  constexpr int kDraws = 3000;
  EngineOptions o = small_blocks();
  o.max_queue = kDraws;
  Engine engine(*model_, *tokenizer_, o);
  const std::vector<int64_t> counts = second_token_counts(engine, prompt, params, SpeculativeMode::kNgram, kDraws);
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.spec_rounds, kDraws / 3);  // the test exercises verification
  EXPECT_GT(m.spec_accepted_tokens, 0);
  spec_stats::expect_fits(counts, spec_stats::second_token_distribution(*model_, prompt, params),
                          "engine, n-gram drafts, second token");
}

TEST(EngineSpeculationRealModel, SmolLM2MixedConcurrentGreedyEqualsWithout) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow unoptimized";
  const std::string path = test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the SmolLM2 model is not in models/";
  auto model = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  const std::string question = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<std::string> texts = {
      "Repeat this list exactly: apples, bananas, cherries, dates, figs, grapes, lemons.\napples, bananas,",
      "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
      "Once upon a time, there was a",
      question + "The capital of France is Paris.<|im_end|>\n" + question,  // ends with EOS, which drafts propose
  };
  std::vector<GenerationRequest> requests;
  for (const std::string& text : texts) {
    GenerationRequest r = greedy_request(tok.encode(text, tok.add_bos()), 24);
    r.ignore_eos = false;
    requests.push_back(r);
  }
  const auto plain = run_alone(*model, tok, requests, 1);  // one thread: fast on a busy machine too
  EXPECT_EQ(plain[3].finish_reason, "stop");
  std::vector<GenerationRequest> mixed;
  for (const GenerationRequest& r : requests) {
    mixed.push_back(with_spec(r, 4));
    mixed.push_back(r);
  }
  EngineOptions o;
  o.kv_blocks = 128;
  o.threads = 1;
  Engine engine(*model, tok, o);
  const auto together = run_together(engine, mixed);
  for (size_t i = 0; i < together.size(); ++i) expect_same({together[i]}, {plain[i / 2]}, "SmolLM2 " + std::to_string(i));
  EXPECT_GT(engine.metrics().spec_accepted_tokens, 0);
  expect_pool_idle(engine);
}

// ---- Draft-model speculation in the engine ----

TEST_F(EngineDraftModel, GreedyAloneEqualsTheTargetForEveryK) {
  const auto requests = workload(vocab(), 24);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  Engine engine(*model_, *tokenizer_, with_draft_model(small_blocks()));
  for (const auto& [k, adaptive] : std::vector<std::pair<int64_t, bool>>{{1, false}, {4, false}, {8, true}}) {
    std::vector<Output> spec;
    for (const GenerationRequest& r : requests) spec.push_back(run_together(engine, {with_draft(r, k, adaptive)})[0]);
    expect_same(spec, plain, "draft model, k " + std::to_string(k));
  }
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.spec_rounds, 0);
  EXPECT_GT(m.spec_accepted_tokens, 0);                 // some drafts are kept
  EXPECT_LT(m.spec_accepted_tokens, m.spec_draft_tokens);  // and some rolled back
  expect_pool_idle(engine);
}

// Draft passes are batched: eight drafting sequences share each pass, so
// passes are far fewer than drafts; the draft K/V pool is as large as the
// target's and empty again at the end.
TEST_F(EngineDraftModel, ConcurrentSequencesShareDraftPasses) {
  const auto requests = workload(vocab(), 24);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  std::vector<GenerationRequest> drafting;
  for (const GenerationRequest& r : requests) drafting.push_back(with_draft(r, 4));
  Engine engine(*model_, *tokenizer_, with_draft_model(small_blocks()));
  expect_same(run_together(engine, drafting), plain, "draft model, 8 together");
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.draft_kv_blocks_total, m.kv_blocks_total);
  EXPECT_GT(m.spec_draft_passes, 0);
  EXPECT_LT(m.spec_draft_passes * 2, m.spec_draft_tokens);
  expect_pool_idle(engine);
}

TEST_F(EngineDraftModel, EightConcurrentMixedRequestsEqualEachRunAlone) {
  auto requests = workload(vocab(), 24);
  requests[2].sampling.repetition_penalty = 1.3f;  // the draft's q and the target's p see the same penalties
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  std::vector<GenerationRequest> mixed = requests;  // draft model, n-gram and plain requests together
  for (size_t i = 0; i < mixed.size(); i += 2) mixed[i] = with_draft(mixed[i], 4);
  for (size_t i = 1; i < mixed.size(); i += 4) mixed[i] = with_spec(mixed[i], 6, true);
  mixed[7] = with_draft(mixed[7], 6, true);
  EngineOptions o = with_draft_model(small_blocks());
  o.max_batch_tokens = 16;  // the budget, not k, limits the drafts
  Engine engine(*model_, *tokenizer_, o);
  expect_same(run_together(engine, mixed), plain, "concurrent");
  EXPECT_GT(engine.metrics().spec_rounds, 0);
  expect_pool_idle(engine);
}

TEST_F(EngineDraftModel, PreemptionUnderATinyPoolGivesIdenticalOutputs) {
  auto requests = workload(vocab(), 30);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  for (GenerationRequest& r : requests) r = with_draft(r, 4);
  EngineOptions o = with_draft_model(small_blocks());
  o.kv_blocks = 24;  // 96 token slots for 8 sequences of up to 58 tokens
  Engine engine(*model_, *tokenizer_, o);
  expect_same(run_together(engine, requests), plain, "tiny pool");
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.preemptions, 0);  // recomputed sequences re-sync their draft caches
  EXPECT_GT(m.spec_rounds, 0);
  expect_pool_idle(engine);
}

// The target as its own draft: every draft is accepted (the plumbing is
// right), and max_tokens / stop strings still end rounds mid-way.
TEST_F(EngineDraftModel, TheTargetAsItsOwnDraftAcceptsEverythingAndStopsMidRound) {
  EngineOptions o = small_blocks();
  o.draft_model = model_.get();
  Engine engine(*model_, *tokenizer_, o);
  const GenerationRequest base = greedy_request(mixed_requests(1, vocab(), 20)[0].prompt, 20);
  const Output full = run_alone(*model_, *tokenizer_, {base})[0];
  expect_same({run_together(engine, {with_draft(base, 4)})[0]}, {full}, "self draft");
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.spec_draft_tokens, 0);
  EXPECT_EQ(m.spec_accepted_tokens, m.spec_draft_tokens);
  EXPECT_LE(m.spec_rounds, 20 / 5 + 1);  // k + 1 = 5 tokens per verification
  expect_rounds_end_mid_way(engine, base, full, SpeculativeMode::kDraftModel);
  expect_pool_idle(engine);
}

TEST_F(EngineDraftModel, ADraftWithAnotherVocabularyIsRefused) {
  test_util::TempFile qwen(".gguf");
  test_util::write_synth_model(qwen.path(), "tiny-qwen2");
  auto other = Model::load(qwen.path());
  EngineOptions o;
  o.draft_model = other.get();
  try {
    Engine engine(*model_, *tokenizer_, o);
    FAIL() << "a draft with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary of 384 tokens but the target"), std::string::npos) << e.what();
  }
}

// Sampling with the draft model's own q (not one-hot): the full min(1, p/q)
// rule with the residual keeps the target's distribution.
TEST_F(EngineDraftModel, SampledTokensKeepTheTargetsDistribution) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow unoptimized";
  spec_stats::SingleThreaded single_threaded;
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 12; ++i) prompt.push_back((i * 7 + 3) % static_cast<int32_t>(vocab()));
  const SamplingParams params = untruncated();
  constexpr int kDraws = 3000;
  EngineOptions o = with_draft_model(small_blocks());
  o.max_queue = kDraws;
  Engine engine(*model_, *tokenizer_, o);
  const auto counts = second_token_counts(engine, prompt, params, SpeculativeMode::kDraftModel, kDraws);
  const EngineMetrics m = engine.metrics();
  EXPECT_GE(m.spec_rounds, kDraws);  // every request verifies drafts for its second token
  EXPECT_GT(m.spec_accepted_tokens, 0);
  EXPECT_LT(m.spec_accepted_tokens, m.spec_draft_tokens);  // rejections exercise the residual
  spec_stats::expect_fits(counts, spec_stats::second_token_distribution(*model_, prompt, params),
                          "engine, draft model, second token");
}

// Auto mode with a draft model and prompt lookup to choose from (free drafts,
// so it drafts from the first decode step): greedy equals the target alone,
// under preemption too, and the sampled second token keeps the exact marginal.
TEST_F(EngineDraftModel, AutoGreedyEqualsTheTargetAloneUnderPreemption) {
  const auto requests = workload(vocab(), 30);
  const auto plain = run_alone(*model_, *tokenizer_, requests);
  EngineOptions o = with_draft_model(small_blocks());
  o.step_cost = kFlatStepCost;
  o.kv_blocks = 24;
  Engine engine(*model_, *tokenizer_, o);
  std::vector<GenerationRequest> spec;
  for (const GenerationRequest& r : requests) spec.push_back(with_auto(r, 4));
  expect_same(run_together(engine, spec), plain, "auto, draft model, 24 blocks");
  EXPECT_GT(engine.metrics().spec_rounds, 0);
  expect_pool_idle(engine);
}

TEST_F(EngineDraftModel, AutoSampledTokensKeepTheTargetsDistribution) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow unoptimized";
  spec_stats::SingleThreaded single_threaded;
  std::vector<int32_t> prompt;  // repeats itself: prompt lookup has drafts too
  for (int32_t i = 0; i < 24; ++i) prompt.push_back((i % 12 * 7 + 3) % static_cast<int32_t>(vocab()));
  const SamplingParams params = untruncated();
  constexpr int kDraws = 3000;
  EngineOptions o = with_draft_model(small_blocks());
  o.max_queue = 2 * kDraws;  // the queue check counts arrivals the engine has not taken in yet twice
  o.step_cost = kFlatStepCost;
  o.spec_min_draft_gain = 1.0;  // draft on any expected gain: this random model's drafts rarely hit
  Engine engine(*model_, *tokenizer_, o);
  const auto counts = second_token_counts(engine, prompt, params, SpeculativeMode::kAuto, kDraws);
  const EngineMetrics m = engine.metrics();
  EXPECT_GE(m.spec_rounds, kDraws / 2);
  EXPECT_GT(m.spec_accepted_tokens, 0);
  EXPECT_LT(m.spec_accepted_tokens, m.spec_draft_tokens);
  spec_stats::expect_fits(counts, spec_stats::second_token_distribution(*model_, prompt, params),
                          "engine, auto speculation, second token");
}

// Qwen2.5-Coder 0.5B drafting for 1.5B through the engine: greedy output
// equal to the target alone.
TEST(EngineSpeculationRealModel, QwenCoderDraftGreedyEqualsTheTargetAlone) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow unoptimized";
  const std::string target_path = test_util::model_dir() + "/qwen2.5-coder-1.5b-instruct.gguf";
  const std::string draft_path = test_util::model_dir() + "/qwen2.5-coder-0.5b-instruct.gguf";
  if (!std::filesystem::exists(target_path) || !std::filesystem::exists(draft_path))
    GTEST_SKIP() << "the Qwen2.5-Coder models are not in models/";
  auto target = Model::load(target_path);
  auto draft = Model::load(draft_path);
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  const GenerationRequest r = greedy_request(tok.encode("def fibonacci(n):\n", tok.add_bos()), 16);
  const Output plain = run_alone(*target, tok, {r}, 1)[0];
  EngineOptions o;
  o.max_context = 256;
  o.threads = 1;  // as run_alone: the same kernels' rounding
  o.draft_model = draft.get();
  Engine engine(*target, tok, o);
  expect_same({run_together(engine, {with_draft(r, 4)})[0]}, {plain}, "qwen coder");
  const EngineMetrics m = engine.metrics();
  EXPECT_GT(m.spec_rounds, 0);
  EXPECT_GT(m.spec_accepted_tokens, 0);  // a real draft of the same family agrees often
  expect_pool_idle(engine);
  // The fast draft configuration (--draft-vocab 16384, 8-bit activations): the same text.
  auto fast_draft = Model::load(draft_path, {.max_output_rows = 16384, .activations = ActivationPrecision::kQ8});
  o.draft_model = fast_draft.get();
  Engine fast(*target, tok, o);
  expect_same({run_together(fast, {with_draft(r, 4)})[0]}, {plain}, "qwen coder, fast draft");
  EXPECT_GT(fast.metrics().spec_accepted_tokens, 0);
  expect_pool_idle(fast);
}
