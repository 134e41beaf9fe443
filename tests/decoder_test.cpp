// The naive and cached decoders on tiny random-weight models: same greedy
// tokens, same logits, and the attention work each one does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "decode/decoder.h"
#include "model/synth.h"
#include "sampling/sampler.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;
using kvserve::test_util::relative_error;

namespace {

std::unique_ptr<Model> tiny_model(const TempFile& file, const std::string& preset, DType type) {
  ::kvserve::test_util::write_synth_model(file.path(), preset, type, 7);
  // Naive and cached decoders agree to float rounding with exact activations.
  return Model::load(file.path(), {.activations = ActivationPrecision::kF32});
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return p;
}

// Greedy-decodes `steps` tokens with every decoder kind in lockstep and
// checks tokens and logits agree at every step.
void expect_decoders_agree(const Model& m, int64_t prompt_len, int steps) {
  auto naive = make_decoder("naive", m, 256);
  auto cached = make_decoder("cached", m, 256);
  auto cached_ref = make_decoder("cached-reference", m, 256);
  std::vector<int32_t> tokens = prompt_of(prompt_len, m.config().vocab_size);
  std::span<const float> a = naive->append(tokens), b = cached->append(tokens), c = cached_ref->append(tokens);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> la(a.begin(), a.end()), lb(b.begin(), b.end()), lc(c.begin(), c.end());
    EXPECT_LT(relative_error(lb, la), 1e-4) << "prompt " << prompt_len << " step " << s;
    EXPECT_LT(relative_error(lc, la), 1e-4) << "prompt " << prompt_len << " step " << s;
    const int32_t ta = argmax(la), tb = argmax(lb);
    ASSERT_EQ(ta, tb) << "prompt " << prompt_len << " step " << s;
    a = naive->append(std::span<const int32_t>(&ta, 1));
    b = cached->append(std::span<const int32_t>(&tb, 1));
    c = cached_ref->append(std::span<const int32_t>(&tb, 1));
  }
}

}  // namespace

TEST(Decoder, NaiveAndCachedAgreeOnTinyLlama) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  for (int64_t n : {1, 5, 17, 40}) expect_decoders_agree(*m, n, 6);
}

TEST(Decoder, NaiveAndCachedAgreeOnTinyQwen2WithBiasesAndNeoxRope) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-qwen2", DType::F32);
  EXPECT_TRUE(m->config().rope_neox);
  EXPECT_FALSE(m->weights().layers[0].bq.empty());
  for (int64_t n : {1, 9, 33}) expect_decoders_agree(*m, n, 5);
}

TEST(Decoder, NaiveAndCachedAgreeOnQuantizedWeights) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::BF16, DType::F16}) {
    TempFile f(".gguf");
    auto m = tiny_model(f, "tiny-llama", t);
    expect_decoders_agree(*m, 12, 4);
  }
}

// Q4_K / Q5_K / Q6_K everywhere (rows of 256 and 512 values, token_embd
// included, so embedding lookup decodes K-quant rows), and Q5_0 on the
// 64-wide model whose rows cannot hold a super-block.
TEST(Decoder, NaiveAndCachedAgreeOnKQuantWeights) {
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    TempFile f(".gguf");
    auto m = tiny_model(f, "tiny-qwen2-256", t);
    EXPECT_EQ(m->weights().token_embd.type, t);
    EXPECT_EQ(m->weights().layers[1].w_down.type, t);
    EXPECT_EQ(m->weights().layers[0].wq.type, t);
    expect_decoders_agree(*m, 12, 4);
  }
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-qwen2", DType::Q4_K);
  EXPECT_EQ(m->weights().layers[0].wk.type, DType::Q5_0);  // 64-value rows fall back to Q5_0
  expect_decoders_agree(*m, 12, 4);
}

TEST(Decoder, CountsAttentionRows) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  const int64_t prompt = 10, steps = 20;
  for (const char* kind : {"naive", "cached"}) {
    auto d = make_decoder(kind, *m, 64);
    d->append(prompt_of(prompt, m->config().vocab_size));
    for (int64_t s = 0; s < steps; ++s) {
      const int32_t t = 3;
      d->append(std::span<const int32_t>(&t, 1));
    }
    // Naive recomputes every position at every step: sum of lengths 10..30.
    const int64_t n = prompt + steps;
    const int64_t expected = std::string(kind) == "naive" ? n * (n + 1) / 2 - (prompt - 1) * prompt / 2 : n;
    EXPECT_EQ(d->attention_rows(), expected) << kind;
  }
}

// The attention kernels' wall time accrues with every step (what `kvserve
// bench` divides the K/V bytes by).
TEST(Decoder, TimesAttention) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  auto d = make_decoder("cached", *m, 64);
  EXPECT_EQ(d->attention_seconds(), 0.0);
  d->append(prompt_of(10, m->config().vocab_size));
  const double after_prompt = d->attention_seconds();
  EXPECT_GT(after_prompt, 0.0);
  const int32_t t = 3;
  d->append(std::span<const int32_t>(&t, 1));
  EXPECT_GT(d->attention_seconds(), after_prompt);
}

TEST(Decoder, RejectsOverflowAndBadTokens) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  for (const char* kind : {"naive", "cached"}) {
    auto d = make_decoder(kind, *m, 8);
    EXPECT_THROW(d->append(prompt_of(9, m->config().vocab_size)), Error) << kind;
    const int32_t bad = static_cast<int32_t>(m->config().vocab_size);
    EXPECT_THROW(d->append(std::span<const int32_t>(&bad, 1)), Error) << kind;
  }
  EXPECT_THROW(make_decoder("fast", *m, 8), Error);
  EXPECT_THROW(make_decoder("cached", *m, m->config().context_length + 1), Error);
}

TEST(Decoder, ResetStartsOver) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  auto d = make_decoder("cached", *m, 64);
  const auto p = prompt_of(7, m->config().vocab_size);
  std::vector<float> first(d->append(p).begin(), d->append(p).end());
  (void)first;
  d->reset();
  auto once = d->append(p);
  std::vector<float> a(once.begin(), once.end());
  d->reset();
  auto twice = d->append(p);
  EXPECT_EQ(a, std::vector<float>(twice.begin(), twice.end()));
  EXPECT_EQ(d->length(), 7);
}

TEST(Decoder, AppendAllGivesEveryPositionsLogits) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  const auto p = prompt_of(9, m->config().vocab_size);
  const auto vocab = static_cast<size_t>(m->config().vocab_size);
  for (const char* kind : {"naive", "cached"}) {
    auto batched = make_decoder(kind, *m, 64);
    batched->append(std::span<const int32_t>(p).first(4));
    const std::span<const float> rows = batched->append_all(std::span<const int32_t>(p).subspan(4));
    ASSERT_EQ(rows.size(), 5 * vocab);
    auto one_by_one = make_decoder(kind, *m, 64);
    one_by_one->append(std::span<const int32_t>(p).first(4));
    for (size_t i = 4; i < p.size(); ++i) {
      auto l = one_by_one->append(std::span<const int32_t>(&p[i], 1));
      EXPECT_LT(relative_error(rows.subspan((i - 4) * vocab, vocab), l), 1e-5) << kind << " row " << i;
    }
  }
}

TEST(Decoder, TruncateRollsBack) {
  TempFile f(".gguf");
  auto m = tiny_model(f, "tiny-llama", DType::F32);
  const auto p = prompt_of(12, m->config().vocab_size);
  for (const char* kind : {"naive", "cached"}) {
    auto d = make_decoder(kind, *m, 64);
    auto want = d->append(p);
    std::vector<float> expected(want.begin(), want.end());
    d->reset();
    d->append(std::span<const int32_t>(p).first(8));
    const std::vector<int32_t> wrong = {5, 6, 7};
    d->append(wrong);
    d->truncate(8);
    EXPECT_EQ(d->length(), 8);
    auto got = d->append(std::span<const int32_t>(p).subspan(8));
    EXPECT_LT(relative_error(got, expected), 1e-5) << kind;
    EXPECT_THROW(d->truncate(13), Error);
  }
}

// Sliding-window layers in a ring (CachedDecoder with a short prefill chunk
// and rewind: tiny-gemma3's five sliding layers keep 3 x 64 of 256 positions):
// every logit the same bits as keeping every position, prompt in chunks of 16
// then decoding past the ring twice over; a rollback the
// ring still holds works, one past it is refused with an error.
TEST(Decoder, SlidingRingGivesTheFullCachesBits) {
  TempFile file(".gguf");
  ::kvserve::test_util::write_synth_model(file.path(), "tiny-gemma3", DType::Q8_0, 7);
  const auto m = Model::load(file.path());
  ASSERT_GT(m->config().sliding_window, 0);
  CachedDecoder ring(*m, 256, 16, AttentionKernel::kFlash, KVType::F16, 8);
  CachedDecoder full(*m, 256, 16, AttentionKernel::kFlash, KVType::F16, 1000);
  const int64_t vocab = m->config().vocab_size;
  std::vector<int32_t> tokens = prompt_of(100, vocab);
  std::span<const float> a = ring.append(tokens), b = full.append(tokens);
  for (int64_t pos = 100; pos < 250; ++pos) {
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "position " << pos;
    const auto next = static_cast<int32_t>((pos * 13 + 5) % vocab);
    a = ring.append({&next, 1});
    b = full.append({&next, 1});
  }
  ring.truncate(242);
  full.truncate(242);
  const int32_t next = 3;
  a = ring.append({&next, 1});
  b = full.append({&next, 1});
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "after a rollback of 8";
  try {
    ring.truncate(100);
    FAIL() << "a rollback past the ring was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding-window layers keep only the last"), std::string::npos) << e.what();
  }
}
