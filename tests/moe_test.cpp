// Mixture-of-experts models (qwen3moe, qwen2moe, deepseek; issue #35): the router's
// top-k against a sorted softmax, grouping by expert, the naive, cached and
// batched decoders agreeing on tiny random models, and the batching engine
// giving each request the tokens it gets alone (grouping tokens by expert
// must not make a token's result depend on the others in its step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "decode/decoder.h"
#include "decoder_agreement.h"
#include "engine_run_util.h"
#include "model/expert_routing.h"
#include "model/model.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;
using test_util::TempFile;

namespace {

// The plain algorithm: softmax in double, experts sorted by probability (ties: lower id).
std::vector<ExpertChoice> reference_route(const std::vector<float>& logits, int64_t k, bool normalize) {
  const auto E = static_cast<int64_t>(logits.size());
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t e = 0; e < p.size(); ++e) sum += p[e] = std::exp(logits[e] - max);
  for (double& v : p) v /= sum;
  std::vector<int32_t> ids(static_cast<size_t>(E));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  std::vector<ExpertChoice> out;
  double chosen = 0;
  for (int64_t i = 0; i < k; ++i) chosen += p[ids[i]];
  for (int64_t i = 0; i < k; ++i)
    out.push_back({ids[i], static_cast<float>(normalize ? p[ids[i]] / chosen : p[ids[i]])});
  return out;
}

std::unique_ptr<Model> tiny_moe(const TempFile& file, const std::string& preset, DType type,
                                std::optional<ActivationPrecision> activations = std::nullopt) {
  test_util::write_synth_model(file.path(), preset, type, 5);
  ModelLoadOptions o;
  o.activations = activations;
  return Model::load(file.path(), o);
}

}  // namespace

TEST(ExpertRouting, TopKIsTheSortedSoftmaxsFirstK) {
  std::mt19937 rng(3);
  for (auto [E, k] : {std::pair<int64_t, int64_t>{7, 3}, {60, 4}, {128, 8}, {5, 5}, {1, 1}}) {
    for (bool normalize : {false, true}) {
      const int64_t n = 9;
      std::vector<float> logits = test_util::random_vector(static_cast<size_t>(n * E), rng, 3.0f);
      std::vector<ExpertChoice> got(static_cast<size_t>(n * k));
      route_tokens(logits.data(), n, E, k, normalize, got);
      for (int64_t t = 0; t < n; ++t) {
        const auto want = reference_route({logits.begin() + t * E, logits.begin() + (t + 1) * E}, k, normalize);
        float sum = 0;
        for (int64_t i = 0; i < k; ++i) {
          const ExpertChoice& g = got[static_cast<size_t>(t * k + i)];
          EXPECT_EQ(g.expert, want[static_cast<size_t>(i)].expert) << "E " << E << " token " << t << " rank " << i;
          EXPECT_NEAR(g.weight, want[static_cast<size_t>(i)].weight, 1e-6) << "E " << E << " token " << t;
          sum += g.weight;
        }
        if (normalize) {
          EXPECT_NEAR(sum, 1.0f, 1e-5);
        }
      }
    }
  }
}

TEST(ExpertRouting, TiesGoToTheLowerExpertId) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f, 2.0f};
  std::vector<ExpertChoice> got(2);
  route_tokens(logits.data(), 1, 5, 2, true, got);
  EXPECT_EQ(got[0].expert, 1);
  EXPECT_EQ(got[1].expert, 3);
  EXPECT_FLOAT_EQ(got[0].weight, 0.5f);
}

TEST(ExpertRouting, GroupsListEachExpertsRowsInRowOrder) {
  // 4 rows, k = 2, 5 experts.
  const std::vector<ExpertChoice> choices = {{3, 0.6f}, {0, 0.4f}, {0, 0.7f}, {4, 0.3f},
                                             {3, 0.5f}, {1, 0.5f}, {4, 0.9f}, {3, 0.1f}};
  ExpertGroups g;
  group_by_expert(choices, 2, 5, g);
  EXPECT_EQ(g.offsets, (std::vector<int64_t>{0, 2, 3, 3, 6, 8}));
  EXPECT_EQ(g.rows, (std::vector<int64_t>{0, 1, 2, 0, 2, 3, 1, 3}));
  EXPECT_EQ(g.weights, (std::vector<float>{0.4f, 0.7f, 0.5f, 0.6f, 0.5f, 0.1f, 0.3f, 0.9f}));
  EXPECT_EQ(g.count(2), 0);
}

TEST(MoeModel, ReadsQwenMoeShapesAndExperts) {
  TempFile f3(".gguf"), f2(".gguf");
  auto q3 = tiny_moe(f3, "tiny-qwen3moe", DType::Q8_0);
  const ModelConfig& c3 = q3->config();
  EXPECT_TRUE(c3.is_moe());
  EXPECT_EQ(c3.n_experts, 8);
  EXPECT_EQ(c3.n_experts_used, 2);
  EXPECT_EQ(c3.expert_ffn_dim, 64);
  EXPECT_TRUE(c3.expert_weights_norm);
  EXPECT_EQ(c3.shared_expert_ffn_dim, 0);
  const LayerWeights& l = q3->weights().layers[1];
  ASSERT_EQ(l.experts.size(), 8u);
  EXPECT_EQ(l.router.type, DType::F32);
  EXPECT_EQ(l.experts[7].down.rows(), 64);
  EXPECT_EQ(l.experts[7].down.cols(), 64);
  EXPECT_EQ(l.experts[3].gate.data, l.experts[2].gate.data + l.experts[2].gate.nbytes);
  // Per token: attention, router and 2 of the 8 experts, plus the embedding row and the head.
  size_t want = q3->weights().output.nbytes + q3->weights().token_embd.row_bytes();
  for (const LayerWeights& layer : q3->weights().layers) {
    want += layer.wq.nbytes + layer.wk.nbytes + layer.wv.nbytes + layer.wo.nbytes + layer.router.nbytes;
    want += 2 * (layer.experts[0].gate.nbytes + layer.experts[0].up.nbytes + layer.experts[0].down.nbytes);
  }
  EXPECT_EQ(q3->weight_bytes_per_token(), want);

  auto q2 = tiny_moe(f2, "tiny-qwen2moe", DType::Q8_0);
  const ModelConfig& c2 = q2->config();
  EXPECT_EQ(c2.n_experts_used, 4);
  EXPECT_FALSE(c2.expert_weights_norm);
  EXPECT_EQ(c2.shared_expert_ffn_dim, 96);
  EXPECT_EQ(q2->weights().layers[0].shared_down.cols(), 96);
  EXPECT_EQ(q2->weights().layers[0].shared_gate_inp.size(), 64u);

  // deepseek: the first block dense, then 8 experts whose weights are scaled 1.5, two ungated shared experts.
  TempFile fd(".gguf");
  auto ds = tiny_moe(fd, "tiny-deepseek", DType::Q8_0);
  const ModelConfig& cd = ds->config();
  EXPECT_EQ(cd.leading_dense_blocks, 1);
  EXPECT_EQ(cd.expert_weights_scale, 1.5);
  EXPECT_EQ(cd.shared_expert_ffn_dim, 2 * 32);
  EXPECT_FALSE(cd.shared_expert_gated);
  const LayerWeights& dense = ds->weights().layers[0];
  EXPECT_TRUE(dense.experts.empty());
  EXPECT_EQ(dense.w_gate.rows(), 128);
  const LayerWeights& moe = ds->weights().layers[2];
  EXPECT_EQ(moe.experts.size(), 8u);
  EXPECT_TRUE(moe.shared_gate_inp.empty());
  EXPECT_EQ(moe.shared_down.cols(), 64);
}

// Exact activations: the naive (full recompute), cached and cached-reference
// decoders agree to float rounding, prompts of several lengths, greedy in lockstep.
TEST(MoeModel, NaiveAndCachedDecodersAgree) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen2moe", "tiny-deepseek"}) {
    TempFile f(".gguf");
    auto m = tiny_moe(f, preset, DType::F32, ActivationPrecision::kF32);
    decoder_agreement::expect_naive_and_cached_decoders_agree(*m, preset);
  }
}

// Continuous batching with chunked prefill: requests that share steps (and so
// experts' row groups) get exactly the tokens and logprobs they get alone,
// with the default 8-bit activations and quantized weights.
TEST(MoeModel, BatchedRequestsGetWhatTheyGetAlone) {
  for (const char* preset : {"tiny-qwen3moe", "tiny-qwen2moe", "tiny-deepseek"}) {
    TempFile f(".gguf");
    auto m = tiny_moe(f, preset, DType::Q8_0);
    std::vector<GenerationRequest> rs;
    for (int i = 0; i < 5; ++i) {
      std::vector<int32_t> p;
      for (int j = 0; j < 20 + 13 * i; ++j) p.push_back(static_cast<int32_t>((j * 31 + 7 * i + 3) % 300));
      GenerationRequest r = greedy_request(p, 12);
      r.top_logprobs = 2;
      rs.push_back(r);
    }
    expect_batched_requests_get_what_they_get_alone(*m, rs, preset);
  }
}

// The rest of the engine on a mixture of experts: shared prefixes (prefix
// cache, copy-on-write), a pool too small for every sequence (preemption and
// recompute), and speculative decoding with n-gram drafts and with a draft
// model made of the target's first block: greedy tokens equal each request alone.
TEST(MoeModel, PrefixCachingPreemptionAndSpeculationKeepTheTokens) {
  TempFile f(".gguf");
  test_util::write_synth_model(f.path(), "tiny-qwen3moe", DType::Q8_0, 5);
  expect_engine_features_keep_greedy_tokens(f.path());
}
