// The ladder on a tiny synthesized model: exact attention-row counters, the
// same greedy text from every rung sharing weights, scaling of a cut rung,
// and the PNG writer's container format.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "ladder/png_writer.h"
#include "ladder/ladder.h"
#include "model/synth.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

namespace {

class LadderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::kvserve::test_util::write_synth_model(model_.path(), "tiny-llama");
  }
  LadderOptions small() const {
    LadderOptions o;
    o.model_path = model_.path();
    o.requests = 3;
    o.prompt_len = 40;
    o.gen_len = 6;
    o.threads = 1;
    return o;
  }
  TempFile model_{".gguf"};
};

uint32_t read_u32_be(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

}  // namespace

TEST_F(LadderTest, CountersAreExactAndEveryRungAgrees) {
  const LadderOptions o = small();
  const LadderResult r = run_ladder(o);
  ASSERT_EQ(r.rungs.size(), 7u);
  const int64_t n_requests = o.requests, p = o.prompt_len, g = o.gen_len;
  // Naive: a prefill of p rows, then steps over p+1, ..., p+g-1 tokens.
  int64_t naive_rows = 0;
  for (int64_t n = p; n < p + g; ++n) naive_rows += n;
  EXPECT_EQ(naive_rows, naive_rows_per_request(p, g));
  EXPECT_EQ(r.rungs[0].attention_rows, n_requests * naive_rows);
  // Cached decoders and the engine without prefix caching: each token once.
  for (int i : {1, 2, 3, 4}) EXPECT_EQ(r.rungs[static_cast<size_t>(i)].attention_rows, n_requests * (p + g - 1)) << i + 1;
  // Prefix caching skips whole cached blocks of the shared half of the prompt.
  EXPECT_EQ(r.rungs[4].prefix_hit_tokens, 0);
  EXPECT_EQ(r.rungs[5].prefix_hit_tokens, (n_requests - 1) * 16);  // one 16-token block of the 20 shared
  EXPECT_EQ(r.rungs[5].attention_rows, r.rungs[4].attention_rows - r.rungs[5].prefix_hit_tokens);
  for (const LadderRung& rung : r.rungs) {
    EXPECT_FALSE(rung.scaled) << rung.number;
    EXPECT_EQ(rung.outputs.size(), static_cast<size_t>(n_requests)) << rung.number;
    EXPECT_EQ(rung.agreement, 1.0) << "rung " << rung.number << " changed the greedy text";
    EXPECT_GT(rung.tokens_per_s(), 0) << rung.number;
  }
  // Rungs 1-3 (f32) agree token for token, request by request.
  EXPECT_EQ(r.rungs[0].outputs, r.rungs[1].outputs);
  EXPECT_EQ(r.rungs[2].outputs, r.rungs[1].outputs);
  for (const auto& out : r.rungs[1].outputs) EXPECT_EQ(out.size(), static_cast<size_t>(g));
  EXPECT_EQ(r.counted.n, 100);
  EXPECT_EQ(r.counted.naive_rows, 5050);
  EXPECT_EQ(r.counted.cached_rows, 100);
  const std::string table = format_ladder_markdown(r);
  EXPECT_NE(table.find("naive 5,050 rows, cached 100 rows"), std::string::npos) << table;
  EXPECT_EQ(ladder_json(r)["rungs"].size(), 7u);
}

// --rounds: the engine rungs run in turn that many times; each keeps its
// fastest run, in rung order, with the same counts as a single run.
TEST_F(LadderTest, RoundsKeepEachEngineRungsFastestRun) {
  LadderOptions o = small();
  o.rounds = 3;
  const LadderResult r = run_ladder(o);
  ASSERT_EQ(r.rungs.size(), 7u);
  for (int i : {4, 5, 6}) {
    const LadderRung& rung = r.rungs[static_cast<size_t>(i)];
    EXPECT_EQ(rung.number, i + 1);
    EXPECT_NE(rung.note.find("fastest of 3 runs"), std::string::npos) << rung.note;
    EXPECT_EQ(rung.agreement, 1.0) << rung.number;
  }
  EXPECT_EQ(r.rungs[5].prefix_hit_tokens, (o.requests - 1) * 16);
  EXPECT_EQ(r.rungs[3].note.find("fastest"), std::string::npos);  // rung 4 runs once
}

TEST_F(LadderTest, ASlowRungIsCutAndScaledByCountedRows) {
  LadderOptions o = small();
  o.rung_budget_s = 0;  // every sequential f32 rung stops as early as it can
  const LadderResult r = run_ladder(o);
  const LadderRung& naive = r.rungs[0];
  EXPECT_TRUE(naive.scaled);
  EXPECT_EQ(naive.measured_requests, 1);
  EXPECT_EQ(naive.measured_tokens, 1);                     // cut after its first token
  EXPECT_EQ(naive.attention_rows, o.prompt_len);           // only the prefill ran
  EXPECT_EQ(naive.full_attention_rows, o.requests * naive_rows_per_request(o.prompt_len, o.gen_len));
  EXPECT_EQ(naive.agreement, 1.0);                         // its one token matches rung 2's
  EXPECT_TRUE(r.rungs[1].scaled);                          // whole requests only: one ran
  EXPECT_EQ(r.rungs[1].measured_requests, 1);
  EXPECT_FALSE(r.rungs[3].scaled);                         // the fast rungs always run everything
  EXPECT_NE(format_ladder_markdown(r).find("scaled to the whole workload"), std::string::npos);
}

TEST_F(LadderTest, LongContextRunsRungsTwoAndThreeOnRungFoursWeights) {
  LadderOptions o = small();
  o.long_context = true;
  o.requests = 2;
  o.prompt_len = 150;
  const LadderResult r = run_ladder(o);
  ASSERT_EQ(r.rungs.size(), 2u);
  EXPECT_TRUE(r.long_context);
  EXPECT_EQ(r.rungs[0].number, 2);
  EXPECT_EQ(r.rungs[1].number, 3);
  for (const LadderRung& rung : r.rungs) {
    EXPECT_NE(rung.weights, "f32") << "long context runs rung 4's quantized weights";
    EXPECT_EQ(rung.attention_rows, o.requests * (o.prompt_len + o.gen_len - 1)) << rung.number;
    EXPECT_EQ(rung.agreement, 1.0) << "flash attention changed the greedy text";
  }
  EXPECT_EQ(r.rungs[0].outputs, r.rungs[1].outputs);
  EXPECT_NE(format_ladder_markdown(r).find("Long context: rungs 2 and 3 only"), std::string::npos);
  EXPECT_TRUE(ladder_json(r)["long_context"].get<bool>());
}

TEST_F(LadderTest, RejectsBadSizes) {
  LadderOptions o = small();
  o.shared_prefix = o.prompt_len;
  EXPECT_THROW(run_ladder(o), Error);
  o = small();
  o.requests = 0;
  EXPECT_THROW(run_ladder(o), Error);
}

TEST(LadderAgreement, CountsCommonPrefixes) {
  EXPECT_DOUBLE_EQ(token_agreement({{1, 2, 3, 4}, {5, 6}}, {{1, 2, 9, 4}, {5, 6}}), 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(token_agreement({{1, 2}}, {{1, 2, 3}}), 1.0);
}

TEST(LadderPng, WritesAValidContainer) {
  RgbImage image(31, 17, 0xFFFFFF);
  image.fill_rect(2, 3, 10, 12, 0x3070C0);
  image.draw_text(1, 1, "1.5X", 0x000000);
  const std::vector<uint8_t> png = encode_png(image);
  const std::vector<uint8_t> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  ASSERT_GT(png.size(), 8u);
  EXPECT_TRUE(std::equal(signature.begin(), signature.end(), png.begin()));
  // Walk the chunks: IHDR first with the size, every CRC correct, IEND last.
  size_t at = 8;
  std::vector<std::string> types;
  while (at + 12 <= png.size()) {
    const uint32_t length = read_u32_be(png, at);
    const std::string type(png.begin() + static_cast<std::ptrdiff_t>(at + 4), png.begin() + static_cast<std::ptrdiff_t>(at + 8));
    ASSERT_LE(at + 12 + length, png.size());
    EXPECT_EQ(read_u32_be(png, at + 8 + length), crc32(png.data() + at + 4, 4 + length)) << type;
    if (type == "IHDR") {
      EXPECT_EQ(read_u32_be(png, at + 8), 31u);
      EXPECT_EQ(read_u32_be(png, at + 12), 17u);
      EXPECT_EQ(png[at + 16], 8);  // bit depth
      EXPECT_EQ(png[at + 17], 2);  // RGB
    }
    types.push_back(type);
    at += 12 + length;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  // Known check values: CRC-32 and Adler-32 of "123456789", Adler-32 of "Wikipedia".
  const std::string digits = "123456789", wiki = "Wikipedia";
  EXPECT_EQ(crc32(reinterpret_cast<const uint8_t*>(digits.data()), digits.size()), 0xCBF43926u);
  EXPECT_EQ(adler32(reinterpret_cast<const uint8_t*>(wiki.data()), wiki.size()), 0x11E60398u);
}
