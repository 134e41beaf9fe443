// Multi-head latent attention (deepseek2; issue #35): the latent cache (one
// row per token and layer, V a view of it), the absorbed attention against
// the decompressed textbook form, DeepSeek-V3's router (sigmoid, selection
// bias, expert groups) against a plain reference, and the decoders and the
// batching engine agreeing on tiny random models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "decode/decoder.h"
#include "kernels/hadamard.h"
#include "decoder_agreement.h"
#include "engine_run_util.h"
#include "kv/kv_planner.h"
#include "kv/kv_pool_sizing.h"
#include "model/expert_routing.h"
#include "model/model.h"
#include "model/transformer.h"
#include "kernels/quantize.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;
using test_util::TempFile;

namespace {

std::unique_ptr<Model> tiny_mla(const TempFile& file, const std::string& preset, DType type,
                                std::optional<ActivationPrecision> activations = std::nullopt) {
  test_util::write_synth_model(file.path(), preset, type, 5);
  ModelLoadOptions o;
  o.activations = activations;
  return Model::load(file.path(), o);
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int64_t salt = 0) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + 11 + salt * 7) % vocab));
  return p;
}

// DeepSeek-V3's choice, written out plainly in double: sigmoid scores, the
// bias added for choosing, groups ranked by their two best biased scores.
std::vector<ExpertChoice> reference_v3_route(const std::vector<float>& logits, const std::vector<float>& bias,
                                             int64_t k, int64_t groups, int64_t groups_used) {
  const auto E = static_cast<int64_t>(logits.size()), per = E / groups;
  std::vector<double> score(logits.size()), biased(logits.size());
  for (size_t e = 0; e < score.size(); ++e) {
    score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
    biased[e] = score[e] + bias[e];
  }
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<double> m(biased.begin() + g * per, biased.begin() + (g + 1) * per);
    std::sort(m.rbegin(), m.rend());
    ranked.push_back({m[0] + m[1], g});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<int32_t> allowed;
  for (int64_t i = 0; i < groups_used; ++i)
    for (int64_t e = 0; e < per; ++e) allowed.push_back(static_cast<int32_t>(ranked[static_cast<size_t>(i)].second * per + e));
  std::sort(allowed.begin(), allowed.end());
  std::stable_sort(allowed.begin(), allowed.end(), [&](int32_t a, int32_t b) { return biased[a] > biased[b]; });
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += score[allowed[i]];
  std::vector<ExpertChoice> out;
  for (int64_t i = 0; i < k; ++i) out.push_back({allowed[i], static_cast<float>(score[allowed[i]] / sum)});
  return out;
}

}  // namespace

TEST(ExpertRouting, SigmoidBiasAndGroupsAsDeepSeekV3) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f), small(0.0f, 0.2f);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t E = 24, k = 5, groups = 6, used = 3;
    std::vector<float> logits(E), bias(E);
    for (float& v : logits) v = normal(rng);
    for (float& v : bias) v = small(rng);
    std::vector<ExpertChoice> got(static_cast<size_t>(k));
    RouterOptions o{E, k, true, true, bias, groups, used};
    route_tokens(logits.data(), 1, o, got);
    const auto want = reference_v3_route(logits, bias, k, groups, used);
    for (int64_t i = 0; i < k; ++i) {
      EXPECT_EQ(got[i].expert, want[i].expert) << "trial " << trial << " choice " << i;
      EXPECT_NEAR(got[i].weight, want[i].weight, 1e-6) << "trial " << trial;
    }
  }
}

TEST(MlaModel, ReadsTheLatentShapesAndCachesOneRowPerToken) {
  TempFile f(".gguf");
  auto m = tiny_mla(f, "tiny-deepseek2", DType::Q8_0);
  const ModelConfig& c = m->config();
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.kv_lora_rank, 64);
  EXPECT_EQ(c.rope_dims, 32);
  EXPECT_EQ(c.qk_nope_dim, 32);
  EXPECT_EQ(c.v_head_dim, 32);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.head_dim, 96);  // the absorbed head: latent + RoPE key
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_FLOAT_EQ(c.attention_scale, 1.0f / std::sqrt(64.0f));  // as the decompressed 32 + 32 dims
  const LayerWeights& l = m->weights().layers[1];
  ASSERT_EQ(l.wk_b.size(), 4u);
  EXPECT_EQ(l.wk_b[3].rows(), 64);
  EXPECT_EQ(l.wk_b[3].cols(), 32);
  EXPECT_EQ(l.wv_b[0].rows(), 32);
  EXPECT_EQ(l.wv_b[0].cols(), 64);
  EXPECT_EQ(l.wkv_a.rows(), 96);
  EXPECT_EQ(l.wo.cols(), 4 * 32);
  EXPECT_TRUE(l.wk.data == nullptr && l.wv.data == nullptr);
  // One latent row per token and layer: half the bytes a K + V cache of that width would take.
  const KVShape shape = c.kv_shape();
  EXPECT_TRUE(shape.values_in_keys());
  EXPECT_EQ(kv_model_shape(shape).kind, AttentionKind::MultiHeadLatent);
  EXPECT_EQ(kv_model_shape(shape).vectors_per_layer() * kv_model_shape(shape).vector_elems(), 96);
  const PagedKVStorage pool = make_kv_storage(shape, {8, 0}, 16, KVType::F16);
  EXPECT_EQ(pool.bytes(), static_cast<size_t>(3 * 8 * 16 * 96 * 2));
  EXPECT_EQ(pool.block_bytes(KVGroup::kFull), PagedKVStorage::bytes_per_block(3, 16, 1, 96, KVType::F16, true));
  EXPECT_EQ(pool.v_block(2, 5), pool.k_block(2, 5));
  EXPECT_EQ(c.kv_bytes_per_token(2), 3 * 96 * 2);

  TempFile f3(".gguf");
  auto v3 = tiny_mla(f3, "tiny-deepseek3", DType::Q8_0);
  const ModelConfig& c3 = v3->config();
  EXPECT_EQ(c3.q_lora_rank, 32);
  EXPECT_TRUE(c3.expert_gating_sigmoid);
  EXPECT_TRUE(c3.expert_weights_norm);
  EXPECT_EQ(c3.expert_groups, 4);
  EXPECT_EQ(c3.expert_groups_used, 2);
  EXPECT_EQ(c3.expert_weights_scale, 2.5);
  EXPECT_EQ(v3->weights().layers[1].expert_bias.size(), 16u);
  EXPECT_EQ(v3->weights().layers[1].wq_b.cols(), 32);
  EXPECT_TRUE(v3->weights().layers[0].expert_bias.empty());  // the dense first block
}

// The older layout (one attn_kv_b per block, key/value_length the decompressed
// sizes): W_UV_h is a view of its rows, W_UK_h their transpose, made at load
// in f32 and kept through repacking.
TEST(MlaModel, ReadsTheOlderFusedLayout) {
  TempFile f(".gguf");
  auto m = tiny_mla(f, "tiny-deepseek2-fused", DType::Q8_0);
  const ModelConfig& c = m->config();
  EXPECT_TRUE(c.mla_fused_kv_b);
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.qk_nope_dim, 32);
  EXPECT_EQ(c.v_head_dim, 32);
  const LayerWeights& l = m->weights().layers[2];
  ASSERT_EQ(l.wk_b.size(), 4u);
  EXPECT_EQ(l.wk_b[1].rows(), 64);
  EXPECT_EQ(l.wk_b[1].cols(), 32);
  EXPECT_EQ(l.wk_b[1].type, DType::F32);
  EXPECT_FALSE(m->file().maps(l.wk_b[1].data));
  EXPECT_TRUE(m->file().maps(l.wv_b[1].data));
  // W_UK^T's row r is column r of the file's W_UK rows of head 1.
  const TensorView& kv_b = m->file().tensor("blk.2.attn_kv_b.weight");
  std::vector<float> file_row(64), ours(32);
  dequantize_row(l.wk_b[1].type, l.wk_b[1].row(5), ours.data(), 32);
  for (int64_t i = 0; i < 32; ++i) {
    dequantize_row(kv_b.type, kv_b.row(1 * 64 + i), file_row.data(), 64);
    EXPECT_EQ(ours[static_cast<size_t>(i)], file_row[5]) << i;
  }
  auto cached = make_decoder("cached", *m, 256, KVType::F16);
  std::span<const float> logits = cached->append(prompt_of(30, c.vocab_size));
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
}

// The absorbed form (queries into the latent space, MQA over the cached rows,
// W_UV after the softmax) is the decompressed one reassociated: in f32 they
// agree to rounding, over a prompt and greedy steps.
TEST(MlaModel, AbsorbedAttentionEqualsTheDecompressedForm) {
  for (const char* preset : {"tiny-deepseek2", "tiny-deepseek3", "tiny-deepseek2-yarn", "tiny-deepseek2-fused"}) {
    TempFile f(".gguf");
    auto m = tiny_mla(f, preset, DType::F32, ActivationPrecision::kF32);
    const ModelConfig& c = m->config();
    Transformer absorbed(*m, AttentionKernel::kFlash), decompressed(*m, AttentionKernel::kFlash);
    decompressed.set_mla_decompressed(true);
    ContiguousKVCache ca(c.n_layers, 256, 1, c.head_dim, KVType::F32, {}, true);
    ContiguousKVCache cd(c.n_layers, 256, 1, c.head_dim, KVType::F32, {}, true);
    std::vector<float> la(static_cast<size_t>(c.vocab_size)), ld(la.size());
    std::vector<int32_t> tokens = prompt_of(150, c.vocab_size);
    absorbed.forward(tokens, ca, la.data());
    decompressed.forward(tokens, cd, ld.data());
    for (int step = 0; step < 8; ++step) {
      EXPECT_LT(test_util::relative_error(la, ld), 1e-5) << preset << " step " << step;
      const auto next = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
      absorbed.forward(std::span<const int32_t>(&next, 1), ca, la.data());
      decompressed.forward(std::span<const int32_t>(&next, 1), cd, ld.data());
    }
  }
}

// A q8_0 latent cache stores its rows Hadamard-rotated (kernels/hadamard.h): the absorbed form rotates the
// queries and turns the values back, the decompressed form turns the rows back before it decompresses them. Both
// read the same rounded rows, so they agree to the query's rounding (absorbed scores use an 8 + 7-bit query), and
// both stay near the f32 cache.
TEST(MlaModel, RotatedQuantizedLatentCacheReadsTheSameInBothForms) {
  TempFile f(".gguf");
  auto m = tiny_mla(f, "tiny-deepseek2", DType::F32, ActivationPrecision::kF32);
  const ModelConfig& c = m->config();
  ASSERT_TRUE(mla_kv_rotation(KVType::Q8_0, c.kv_dim(), c.kv_lora_rank).any());
  Transformer absorbed(*m, AttentionKernel::kFlash), decompressed(*m, AttentionKernel::kFlash),
      exact(*m, AttentionKernel::kFlash);
  decompressed.set_mla_decompressed(true);
  ContiguousKVCache ca(c.n_layers, 256, 1, c.head_dim, KVType::Q8_0, {}, true);
  ContiguousKVCache cd(c.n_layers, 256, 1, c.head_dim, KVType::Q8_0, {}, true);
  ContiguousKVCache ce(c.n_layers, 256, 1, c.head_dim, KVType::F32, {}, true);
  std::vector<float> la(static_cast<size_t>(c.vocab_size)), ld(la.size()), le(la.size());
  const std::vector<int32_t> tokens = prompt_of(150, c.vocab_size);
  absorbed.forward(tokens, ca, la.data());
  decompressed.forward(tokens, cd, ld.data());
  exact.forward(tokens, ce, le.data());
  EXPECT_LT(test_util::relative_error(la, ld), 1e-3);
  EXPECT_LT(test_util::relative_error(la, le), 2e-2);
  EXPECT_GT(test_util::relative_error(la, le), 0.0) << "the q8_0 cache rounds";
}

TEST(MlaModel, NaiveAndCachedDecodersAgree) {
  for (const char* preset : {"tiny-deepseek2", "tiny-deepseek3"}) {
    TempFile f(".gguf");
    auto m = tiny_mla(f, preset, DType::F32, ActivationPrecision::kF32);
    decoder_agreement::expect_naive_and_cached_decoders_agree(*m, preset);
  }
}

// Continuous batching over the paged latent pool, with chunked prefill, the
// default 8-bit activations, quantized weights and each KV type: every request
// gets the tokens and logprobs it gets alone.
TEST(MlaModel, BatchedRequestsGetWhatTheyGetAlone) {
  for (const char* preset : {"tiny-deepseek2", "tiny-deepseek3"}) {
    TempFile f(".gguf");
    auto m = tiny_mla(f, preset, DType::Q8_0);
    std::vector<GenerationRequest> rs;
    for (int i = 0; i < 5; ++i) {
      GenerationRequest r = greedy_request(prompt_of(20 + 13 * i, 300, i), 12);
      r.top_logprobs = 2;
      rs.push_back(r);
    }
    expect_batched_requests_get_what_they_get_alone(*m, rs, preset);
  }
}

// Every KV type holds the latent rows (96 values: q8_0, q4_0 and fp8 blocks of 32 fit).
TEST(MlaModel, EveryKVTypeDecodes) {
  TempFile f(".gguf");
  auto m = tiny_mla(f, "tiny-deepseek2", DType::Q8_0);
  const std::vector<int32_t> prompt = prompt_of(40, m->config().vocab_size);
  for (KVType type : {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0}) {
    auto cached = make_decoder("cached", *m, 256, type);
    std::span<const float> logits = cached->append(prompt);
    EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); })) << kv_type_info(type).name;
  }
}

// The rest of the engine on MLA: shared prefixes (prefix cache, copy-on-write
// of latent blocks), a pool too small for every sequence (preemption), and
// speculative decoding with n-gram drafts and with the target's first block
// as the draft model: greedy tokens equal each request alone.
TEST(MlaModel, PrefixCachingPreemptionAndSpeculationKeepTheTokens) {
  TempFile f(".gguf");
  test_util::write_synth_model(f.path(), "tiny-deepseek2", DType::Q8_0, 5);
  expect_engine_features_keep_greedy_tokens(f.path());
}

