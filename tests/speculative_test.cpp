// Speculative decoding: greedy output identical to the target's, sampled
// output distributed exactly as the target's (chi-square goodness of fit
// against the exact distribution, also with deliberately bad drafts),
// vocabulary checks and rollback bookkeeping.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/rng.h"
#include "decode/decoder.h"
#include "decode/generate.h"
#include "kernels/dispatch.h"
#include "model/synth.h"
#include "spec_stats.h"
#include "speculation/draft_model_batch.h"
#include "speculation/draft_verification.h"
#include "speculation/model_drafter.h"
#include "speculation/ngram_drafter.h"
#include "speculation/speculative_session.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;
using namespace kvserve::spec_stats;

namespace {

// tiny-llama (vocab 320) with `layers` blocks: drafts are its first layers.
std::unique_ptr<Model> tiny_model(const TempFile& file, int layers, uint64_t seed, int max_layers = 0,
                                  const std::string& preset = "tiny-llama") {
  if (!std::filesystem::exists(file.path())) {
    SynthOptions o;
    o.preset = preset;
    o.type = DType::F32;
    o.output_path = file.path();
    o.seed = seed;
    o.layers = layers;
    synthesize_model(o);
  }
  return Model::load(file.path(), ModelLoadOptions{.max_layers = max_layers});
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int64_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt) % vocab));
  return p;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

std::vector<int32_t> plain_tokens(const Model& target, const Tokenizer& tok, std::span<const int32_t> prompt,
                                  int64_t n, const SamplingParams& params) {
  auto decoder = make_decoder("cached", target, 256);
  Sampler sampler(params);
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_at_end_of_generation = false;
  return generate(*decoder, sampler, tok, prompt, o, [](int32_t) { return true; }).tokens;
}

SpeculativeResult speculative_tokens(const Model& target, Drafter& drafter, const Tokenizer& tok,
                                     std::span<const int32_t> prompt, int64_t n, int64_t k,
                                     const SamplingParams& params, bool adaptive = false) {
  auto decoder = make_decoder("cached", target, 256);
  Sampler sampler(params);
  SpeculativeOptions o;
  o.draft_k = k;
  o.adaptive_k = adaptive;
  o.max_new_tokens = n;
  o.stop_at_end_of_generation = false;
  return generate_speculative(*decoder, drafter, sampler, tok, prompt, o, [](int32_t) { return true; });
}

// A deliberately bad drafter: proposes uniformly random tokens and says so.
class UniformDrafter : public Drafter {
 public:
  explicit UniformDrafter(int64_t vocab) : vocab_(vocab) {}
  void propose(std::span<const int32_t>, int64_t k, Sampler& sampler, DraftProposal& out) override {
    out.tokens.clear();
    out.probs.assign(static_cast<size_t>(k * vocab_), 1.0f / static_cast<float>(vocab_));
    for (int64_t i = 0; i < k; ++i)
      out.tokens.push_back(static_cast<int32_t>(std::min<double>(sampler.next_uniform() * vocab_, vocab_ - 1)));
  }
  void commit(std::span<const int32_t>) override {}
  const char* name() const override { return "uniform"; }

 private:
  int64_t vocab_;
};

}  // namespace

TEST(SpecGreedy, TruncatedDraftMatchesTargetTokenForToken) {
  SingleThreaded single_threaded;
  TempFile f(".gguf");
  auto target = tiny_model(f, 4, 7);
  auto draft = tiny_model(f, 4, 7, 1);
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  for (int64_t salt : {1, 11, 50, 123}) {
    const auto prompt = prompt_of(3 + salt % 9, 320, salt);
    const auto want = plain_tokens(*target, tok, prompt, 40, greedy());
    for (int64_t k : {1, 3, 6}) {
      ModelDrafter drafter(*draft, 256);
      const SpeculativeResult r = speculative_tokens(*target, drafter, tok, prompt, 40, k, greedy());
      EXPECT_EQ(r.generation.tokens, want) << "salt " << salt << " k " << k;
      EXPECT_GT(r.stats.target_passes, 0);
      EXPECT_LE(r.stats.target_passes, 40);
    }
  }
}

TEST(SpecGreedy, NgramAndAdaptiveAndPenaltiesMatchTarget) {
  SingleThreaded single_threaded;
  TempFile f(".gguf");
  auto target = tiny_model(f, 4, 7);
  auto draft = tiny_model(f, 4, 7, 2);
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  SamplingParams penalized = greedy();
  penalized.repetition_penalty = 1.3f;
  penalized.frequency_penalty = 0.2f;
  const std::vector<int32_t> prompt = {5, 9, 14, 5, 9, 14, 5, 9, 14, 5};
  for (const SamplingParams& params : {greedy(), penalized}) {
    const auto want = plain_tokens(*target, tok, prompt, 48, params);
    NgramDrafter ngram;
    const SpeculativeResult r = speculative_tokens(*target, ngram, tok, prompt, 48, 4, params);
    EXPECT_EQ(r.generation.tokens, want);
    EXPECT_GT(r.stats.proposed, 0);
    ModelDrafter drafter(*draft, 256);
    EXPECT_EQ(speculative_tokens(*target, drafter, tok, prompt, 48, 8, params, true).generation.tokens, want);
  }
}

TEST(SpecGreedy, StopsAtTheEndOfTheContext) {
  SingleThreaded single_threaded;
  TempFile f(".gguf");
  auto target = tiny_model(f, 4, 7);
  auto draft = tiny_model(f, 4, 7, 1);
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  const auto prompt = prompt_of(20, 320, 3);
  auto decoder = make_decoder("cached", *target, 24);
  ModelDrafter drafter(*draft, 24);
  Sampler sampler(greedy());
  SpeculativeOptions o;
  o.draft_k = 6;
  o.max_new_tokens = 100;
  o.stop_at_end_of_generation = false;
  const auto r = generate_speculative(*decoder, drafter, sampler, tok, prompt, o, [](int32_t) { return true; });
  EXPECT_EQ(r.generation.tokens.size(), 5u);  // 4 more fit in the cache, the 5th is sampled from the last logits
  EXPECT_EQ(r.generation.tokens, plain_tokens(*target, tok, prompt, 5, greedy()));
}

namespace {

struct TokenCounts {
  std::vector<int64_t> first, second;
};

// The first two tokens of `draws` independent speculative generations.
TokenCounts speculative_counts(const Model& target, Drafter& drafter, std::span<const int32_t> prompt, int64_t k,
                               const SamplingParams& params, int draws) {
  const auto vocab = static_cast<size_t>(target.config().vocab_size);
  TokenCounts counts{std::vector<int64_t>(vocab), std::vector<int64_t>(vocab)};
  auto decoder = make_decoder("cached", target, 256);
  Sampler sampler(params);
  SpeculativeSession session(*decoder, drafter, sampler);
  for (int i = 0; i < draws; ++i) {
    session.start(prompt);
    while (session.history().size() < prompt.size() + 2) session.step(k);
    counts.first[static_cast<size_t>(session.history()[prompt.size()])] += 1;
    counts.second[static_cast<size_t>(session.history()[prompt.size() + 1])] += 1;
  }
  return counts;
}

SamplingParams full_distribution() {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 2024;
  return p;
}

class SpecDistribution : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = tiny_model(target_file_, 4, 7);
    truncated_ = tiny_model(target_file_, 4, 7, 1);
    random_draft_ = tiny_model(random_file_, 4, 99);  // same vocabulary, unrelated weights
  }
  static constexpr int kDraws = 4000;
  const std::vector<int32_t> prompt_ = {17, 200, 45, 17, 200, 45, 17, 200};
  SingleThreaded single_threaded_;
  TempFile target_file_{".gguf"}, random_file_{".gguf"};
  std::unique_ptr<Model> target_, truncated_, random_draft_;
};

}  // namespace

TEST_F(SpecDistribution, PlainSamplingFitsTheExactDistribution) {
  // The reference point: the sampler alone passes the same test.
  const SamplingParams params = full_distribution();
  const std::vector<double> p = next_distribution(*target_, prompt_, params);
  auto decoder = make_decoder("cached", *target_, 256);
  const std::span<const float> out = decoder->append(prompt_);
  Sampler sampler(params);
  std::vector<int64_t> counts(p.size());
  std::vector<float> logits;
  for (int i = 0; i < kDraws; ++i) {
    logits.assign(out.begin(), out.end());
    counts[static_cast<size_t>(sampler.sample(logits, prompt_))] += 1;
  }
  expect_fits(counts, p, "plain sampling");
}

TEST_F(SpecDistribution, TruncatedDraftKeepsTheTargetsFirstAndSecondTokenDistributions) {
  // Thousands of draws: over 10 minutes under the sanitizers (their kernels unoptimized); the Release suite runs it.
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  for (const SamplingParams& params : {full_distribution(), SamplingParams{.seed = 5}}) {
    ModelDrafter drafter(*truncated_, 256);
    const TokenCounts c = speculative_counts(*target_, drafter, prompt_, 3, params, kDraws);
    expect_fits(c.first, next_distribution(*target_, prompt_, params), "truncated draft, first token");
    expect_fits(c.second, second_token_distribution(*target_, prompt_, params), "truncated draft, second token");
  }
}

TEST_F(SpecDistribution, BadDraftsStillGiveTheTargetsDistribution) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization (the Release suite runs it)";
  const SamplingParams params = full_distribution();
  const std::vector<double> first = next_distribution(*target_, prompt_, params);
  const std::vector<double> second = second_token_distribution(*target_, prompt_, params);
  ModelDrafter random_weights(*random_draft_, 256);
  TokenCounts c = speculative_counts(*target_, random_weights, prompt_, 3, params, kDraws);
  expect_fits(c.first, first, "random-weight draft, first token");
  expect_fits(c.second, second, "random-weight draft, second token");
  UniformDrafter uniform(target_->config().vocab_size);
  c = speculative_counts(*target_, uniform, prompt_, 2, params, kDraws);
  expect_fits(c.first, first, "uniform draft, first token");
  expect_fits(c.second, second, "uniform draft, second token");
  // A draft head that never proposes ids >= 100: a proposal distribution with
  // zeros, still exact.
  auto narrow = Model::load(target_file_.path(), ModelLoadOptions{.max_layers = 1, .max_output_rows = 100});
  ModelDrafter narrow_head(*narrow, 256);
  c = speculative_counts(*target_, narrow_head, prompt_, 3, params, kDraws);
  expect_fits(c.first, first, "narrow-head draft, first token");
  expect_fits(c.second, second, "narrow-head draft, second token");
  NgramDrafter ngram;  // the prompt repeats, so it proposes 45 17 200 ...
  c = speculative_counts(*target_, ngram, prompt_, 3, params, kDraws);
  expect_fits(c.first, first, "n-gram draft, first token");
  expect_fits(c.second, second, "n-gram draft, second token");
}

TEST_F(SpecDistribution, TheTestDetectsTheDraftsOwnDistribution) {
  // Negative control: emitting the draft's samples unverified must fail.
  const SamplingParams params = full_distribution();
  const std::vector<double> p = next_distribution(*target_, prompt_, params);
  const std::vector<double> q = next_distribution(*random_draft_, prompt_, params);
  Sampler sampler(params);
  std::vector<int64_t> counts(q.size());
  const std::vector<float> qf(q.begin(), q.end());
  for (int i = 0; i < kDraws; ++i) counts[static_cast<size_t>(draw_token(qf, sampler))] += 1;
  const ChiSquare c = chi_square(counts, p);
  EXPECT_GT(c.statistic, c.critical);
}

TEST(SpecVocabulary, MismatchedSizesAreRefusedNamingBoth) {
  TempFile llama(".gguf"), qwen(".gguf");
  auto target = tiny_model(llama, 2, 7);
  auto draft = tiny_model(qwen, 2, 7, 0, "tiny-qwen2");
  try {
    check_same_vocabulary(*target, *draft);
    FAIL() << "expected a vocabulary mismatch error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("384"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("320"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_same_vocabulary(*target, *tiny_model(llama, 2, 7, 1)));
}

TEST(SpecVocabulary, ADifferentTokenIsRefusedNamingIt) {
  TempFile original(".gguf"), edited(".gguf");
  auto target = tiny_model(original, 2, 7);
  // Same file with one token's text changed in place (same length, so the
  // GGUF layout stays valid): "<|im_start|>" becomes "<|im_stArt|>".
  std::ifstream in(original.path(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find("<|im_start|>");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 7] = 'A';
  std::ofstream(edited.path(), std::ios::binary) << bytes;
  auto draft = Model::load(edited.path());
  try {
    check_same_vocabulary(*target, *draft);
    FAIL() << "expected a vocabulary mismatch error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|im_stArt|>"), std::string::npos) << e.what();
  }
}

TEST(SpecRollback, DecodersHoldHistoryMinusThePendingToken) {
  SingleThreaded single_threaded;
  TempFile f(".gguf"), other(".gguf");
  auto target = tiny_model(f, 4, 7);
  auto bad_draft = tiny_model(other, 4, 99);  // mostly rejected: every round rolls back
  auto decoder = make_decoder("cached", *target, 256);
  ModelDrafter drafter(*bad_draft, 256);
  SamplingParams params = full_distribution();
  Sampler sampler(params);
  SpeculativeSession session(*decoder, drafter, sampler);
  const auto prompt = prompt_of(9, 320, 4);
  session.start(prompt);
  EXPECT_EQ(decoder->length(), 8);
  EXPECT_EQ(drafter.decoder().length(), 8);
  for (int round = 0; round < 12; ++round) {
    const auto before = static_cast<int64_t>(session.history().size());
    const auto produced = static_cast<int64_t>(session.step(4).size());
    EXPECT_GE(produced, 1);
    EXPECT_LE(produced, 5);
    EXPECT_EQ(static_cast<int64_t>(session.history().size()), before + produced);
    EXPECT_EQ(decoder->length(), before + produced - 1);
    EXPECT_EQ(drafter.decoder().length(), before + produced - 1);
  }
  EXPECT_LT(session.stats().accepted, session.stats().proposed);  // rejections happened
  EXPECT_EQ(session.stats().generated, session.stats().accepted + session.stats().target_passes);
  // Restarting reuses both decoders from scratch.
  session.start(prompt);
  EXPECT_EQ(decoder->length(), 8);
  EXPECT_EQ(drafter.decoder().length(), 8);
}

TEST(SpecNgram, ProposesTheContinuationOfTheLatestLongestMatch) {
  const std::vector<int32_t> history = {1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3};
  EXPECT_EQ(find_ngram_continuation(history, 2), 7);  // "2 3" last seen before the end at 5..6
  EXPECT_EQ(find_ngram_continuation(history, 3), -1);  // "5 2 3" never occurred before
  EXPECT_EQ(find_ngram_continuation(history, 1), 7);
  NgramDrafter ngram;
  Sampler sampler(greedy());
  DraftProposal out;
  ngram.propose(history, 3, sampler, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{7, 8, 5}));
  EXPECT_TRUE(out.deterministic());
  EXPECT_EQ(ngram.last_match(), 2);  // "2 3": auto speculation's estimate for 2-token matches
  ngram.propose(history, 10, sampler, out);
  EXPECT_EQ(out.tokens.size(), 5u);  // only what follows the match: 7 8 5 2 3
  // A match overlapping the pattern (a loop of period 2 seen over 3 + 2 tokens) repeats: k tokens, not 2.
  ngram.propose(std::vector<int32_t>{4, 9, 6, 9, 6, 9, 6}, 5, sampler, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{9, 6, 9, 6, 9}));
  EXPECT_EQ(ngram.last_match(), 3);
  ngram.propose(std::vector<int32_t>{1, 1}, 4, sampler, out);  // n = 1 matches "1" just before: no overlap
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{1}));
  ngram.propose(std::vector<int32_t>{1, 1, 1}, 4, sampler, out);  // "1 1" at 0..1 overlaps it
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{1, 1, 1, 1}));
  ngram.propose(std::vector<int32_t>{4, 5, 6}, 3, sampler, out);
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_EQ(ngram.last_match(), 0);
  EXPECT_THROW(NgramDrafter(0), Error);
}

TEST(SpecModel, MaxLayersOutOfRangeIsRefused) {
  TempFile f(".gguf");
  auto m = tiny_model(f, 4, 7);
  EXPECT_EQ(tiny_model(f, 4, 7, 2)->config().n_layers, 2);
  EXPECT_EQ(tiny_model(f, 4, 7, 2)->weights().layers.size(), 2u);
  EXPECT_THROW(Model::load(f.path(), ModelLoadOptions{.max_layers = 5}), Error);
  EXPECT_THROW(Model::load(f.path(), ModelLoadOptions{.max_layers = -1}), Error);
}

TEST(SpecModel, MaxOutputRowsKeepsTheFirstLogitsAndMasksTheRest) {
  SingleThreaded single_threaded;
  TempFile f(".gguf");
  auto full = tiny_model(f, 2, 7);
  auto narrow = Model::load(f.path(), ModelLoadOptions{.max_output_rows = 101});
  EXPECT_EQ(narrow->weights().output.rows(), 101);
  EXPECT_LT(narrow->weight_bytes_per_token(), full->weight_bytes_per_token());
  const auto prompt = prompt_of(9, 320, 3);
  auto full_decoder = make_decoder("cached", *full, 64);
  auto narrow_decoder = make_decoder("cached", *narrow, 64);
  // All rows of a multi-token pass (each moved to its own [vocab] stride).
  const std::span<const float> full_logits = full_decoder->append_all(prompt);
  const std::vector<float> want(full_logits.begin(), full_logits.end());
  const std::span<const float> got = narrow_decoder->append_all(prompt);
  ASSERT_EQ(got.size(), prompt.size() * 320);
  for (size_t t = 0; t < prompt.size(); ++t)
    for (size_t id = 0; id < 320; ++id) {
      const float g = got[t * 320 + id];
      if (id < 101) EXPECT_FLOAT_EQ(g, want[t * 320 + id]) << "token " << t << " id " << id;
      else EXPECT_TRUE(std::isinf(g) && g < 0) << "token " << t << " id " << id << ": " << g;
    }
  EXPECT_THROW(Model::load(f.path(), ModelLoadOptions{.max_output_rows = -1}), Error);
  EXPECT_EQ(Model::load(f.path(), ModelLoadOptions{.max_output_rows = 5000})->weights().output.rows(), 320);
}

TEST(SpecModel, ADraftsActivationsApplyToItsPassesOnly) {
  SingleThreaded single_threaded;
  TempFile f(".gguf");
  kvserve::test_util::write_synth_model(f.path(), "tiny-llama", DType::Q4_0, 3);
  const ActivationPrecision process_default = activation_precision();
  {
    const ScopedActivationPrecision scope(ActivationPrecision::kQ8);
    EXPECT_EQ(activation_precision(), ActivationPrecision::kQ8);
    {
      const ScopedActivationPrecision none(std::nullopt);  // empty: no change
      EXPECT_EQ(activation_precision(), ActivationPrecision::kQ8);
    }
  }
  EXPECT_EQ(activation_precision(), process_default);
  auto exact = Model::load(f.path(), ModelLoadOptions{.activations = ActivationPrecision::kF32});
  auto q8 = Model::load(f.path(), ModelLoadOptions{.activations = ActivationPrecision::kQ8});
  const auto prompt = prompt_of(6, 320, 9);
  auto logits_of = [&](const Model& m) {
    auto decoder = make_decoder("cached", m, 64);
    const std::span<const float> out = decoder->append(prompt);
    return std::vector<float>(out.begin(), out.end());
  };
  const std::vector<float> exact_logits = logits_of(*exact), q8_logits = logits_of(*q8);
  EXPECT_EQ(activation_precision(), process_default);  // the passes restored it
  EXPECT_NE(exact_logits, q8_logits);                   // 8-bit activations round
  EXPECT_LT(kvserve::test_util::relative_error(q8_logits, exact_logits), 0.1);
  // A q8 draft for an exact target: still the target's greedy tokens.
  auto target = Model::load(f.path());
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  ModelDrafter drafter(*q8, 256);
  EXPECT_EQ(speculative_tokens(*target, drafter, tok, prompt, 30, 4, greedy()).generation.tokens,
            plain_tokens(*target, tok, prompt, 30, greedy()));
}

TEST(SpecGreedy, NarrowDraftHeadMatchesTargetTokenForToken) {
  SingleThreaded single_threaded;
  TempFile f(".gguf");
  auto target = tiny_model(f, 4, 7);
  auto draft = Model::load(f.path(), ModelLoadOptions{.max_layers = 2, .max_output_rows = 160});
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  for (int64_t salt : {2, 40}) {
    const auto prompt = prompt_of(5 + salt % 7, 320, salt);
    ModelDrafter drafter(*draft, 256);
    const SpeculativeResult r = speculative_tokens(*target, drafter, tok, prompt, 40, 4, greedy());
    EXPECT_EQ(r.generation.tokens, plain_tokens(*target, tok, prompt, 40, greedy())) << "salt " << salt;
  }
}

namespace {

void expect_real_model_greedy_match(const std::string& path, int draft_layers, int64_t n, int64_t k) {
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path << " (run scripts/fetch_models.sh)";
  SingleThreaded single_threaded;
  auto target = Model::load(path);
  auto draft = Model::load(path, ModelLoadOptions{.max_layers = draft_layers});
  const Tokenizer tok = Tokenizer::from_gguf(target->file());
  const std::vector<int32_t> prompt = tok.encode("Once upon a time, there was a little", tok.add_bos());
  const auto want = plain_tokens(*target, tok, prompt, n, greedy());
  ModelDrafter drafter(*draft, 256);
  const SpeculativeResult r = speculative_tokens(*target, drafter, tok, prompt, n, k, greedy());
  EXPECT_EQ(r.generation.tokens, want);
  NgramDrafter ngram;
  EXPECT_EQ(speculative_tokens(*target, ngram, tok, prompt, n, k, greedy()).generation.tokens, want);
}

}  // namespace

TEST(SpecRealModel, SmolLM2WithSixLayerDraftMatchesGreedy) {
  expect_real_model_greedy_match(kvserve::test_util::model_dir() + "/smollm2-135m-instruct-q4_1.gguf", 6, 24, 4);
}

TEST(SpecRealModel, Stories260KWithTwoLayerDraftMatchesGreedy) {
  expect_real_model_greedy_match(kvserve::test_util::model_dir() + "/stories260k.gguf", 2, 48, 4);
}

// What auto mode charges a draft model that fell behind: the history tokens
// the draft has not seen, all of them before its first round, the ones since
// its last round after it.
TEST(DraftModelBatchCatchUp, CountsTheHistoryTheDraftHasNotSeen) {
  test_util::TempFile file(".gguf");
  test_util::write_synth_model(file.path(), "tiny-llama", DType::F32, 2);
  auto draft = Model::load(file.path());
  DraftModelBatch batch(*draft, 64, 4, false, 64);
  std::vector<int32_t> history = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  EXPECT_EQ(batch.catch_up_tokens(1, history), 10);
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy);
  DraftProposal proposal;
  ASSERT_TRUE(batch.reserve(1, history, 3));
  const DraftModelRequest request{1, history, 3, &sampler, &proposal};
  batch.run(std::span(&request, 1));
  ASSERT_EQ(proposal.tokens.size(), 3u);
  EXPECT_EQ(batch.last_catch_up_tokens(), 10);
  // The target accepted the first draft (the draft fed it, so it holds its
  // K/V) and added a token of its own: one to catch up on.
  history.push_back(proposal.tokens[0]);
  history.push_back(7);
  EXPECT_EQ(batch.catch_up_tokens(1, history), 1);
  history.insert(history.end(), {8, 9, 10, 11});  // four more decoded without the draft
  EXPECT_EQ(batch.catch_up_tokens(1, history), 5);
  batch.release(1);
  EXPECT_EQ(batch.catch_up_tokens(1, history), static_cast<int64_t>(history.size()));
}

// Greedy verification takes the target's greedy choice per row instead of
// building a distribution: the same tokens as sampling each row at
// temperature 0 in turn, with and without repetition penalties, for drafts
// that match 0..5 rows, with a one-hot or a spread q.
TEST(SpecVerify, GreedyVerificationIsTheGreedyChoiceWalk) {
  constexpr size_t kVocab = 1001, kDrafts = 5;
  Xoshiro256 rng(42);
  for (const float penalty : {1.0f, 1.3f}) {
    SamplingParams params = greedy();
    params.repetition_penalty = penalty;
    Sampler sampler(params);
    for (size_t matching = 0; matching <= kDrafts; ++matching) {
      std::vector<float> rows((kDrafts + 1) * kVocab);
      for (float& v : rows) v = static_cast<float>(rng.next_uniform() * 8 - 4);
      std::vector<int32_t> history = {3, 17, 3, 999, 250};
      DraftProposal proposal;
      std::vector<int32_t> context = history;
      std::vector<int32_t> expected;
      for (size_t i = 0; i <= kDrafts; ++i) {
        std::vector<float> row(rows.begin() + static_cast<std::ptrdiff_t>(i * kVocab),
                               rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * kVocab));
        const int32_t choice = sampler.sample(row, context);
        expected.push_back(choice);
        if (i == kDrafts) break;
        // The first `matching` drafts are the greedy choice, the next one is not.
        const int32_t draft = i < matching ? choice : (choice + 1) % static_cast<int32_t>(kVocab);
        proposal.tokens.push_back(draft);
        if (draft != choice) break;
        context.push_back(choice);
      }
      while (proposal.tokens.size() < kDrafts) proposal.tokens.push_back(7);  // past the rejection: never read
      VerifyScratch scratch;
      std::vector<int32_t> produced;
      EXPECT_EQ(verify_draft(rows, proposal, history, sampler, scratch, produced), static_cast<int64_t>(matching));
      EXPECT_EQ(produced, expected) << "penalty " << penalty << ", " << matching << " matching";
      // A draft model's q (here spread over two tokens) changes nothing at temperature 0.
      proposal.probs.assign(kDrafts * kVocab, 0.0f);
      for (size_t i = 0; i < kDrafts; ++i) {
        proposal.probs[i * kVocab + static_cast<size_t>(proposal.tokens[i])] += 0.5f;
        proposal.probs[i * kVocab + 11] += 0.5f;
      }
      EXPECT_EQ(verify_draft(rows, proposal, history, sampler, scratch, produced), static_cast<int64_t>(matching));
      EXPECT_EQ(produced, expected);
    }
  }
}
