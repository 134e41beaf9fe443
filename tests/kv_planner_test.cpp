// KV-cache planner: reference sizes of well-known models, quantized and paged
// sizes, memory budgets, size strings, a GGUF file's config, and the command.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <sys/wait.h>

#include "core/error.h"
#include "kv/kv_planner.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

using ::kvserve::test_util::CommandResult;
using ::kvserve::test_util::run_kvserve;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

KVPlan plan_for(const KVModelShape& shape, int64_t ctx, KVType type = KVType::F16, int64_t batch = 1,
                int64_t block_size = 16) {
  KVPlanRequest request;
  request.ctx = ctx;
  request.batch = batch;
  request.block_size = block_size;
  request.type = type;
  return plan_kv_cache(shape, request);
}

// The figure `kvserve kv-size` prints for 32,000 tokens of one sequence in fp16.
std::string preset_gib_32k_f16(const std::string& id) {
  return format_gib(plan_for(find_kv_preset(id).shape, 32000).exact_bytes);
}

void expect_error_containing(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

// Published configs (layers x KV heads x head dim, or MLA latent 512 + rope 64)
// give these at 32,000 tokens in fp16, GiB = 2^30. The issue also quoted
// 30.79 GiB for 405B and 2.10 GiB for DeepSeek V3; neither follows from the
// published configs (126 x 8 x 128 gives 15.38; 61 x 576 gives 2.0943), see
// docs/kv_planner.md.
TEST(KvPlanner, ReferenceFiguresAt32kTokensFp16) {
  EXPECT_EQ(preset_gib_32k_f16("llama-3.1-8b"), "3.91 GiB");
  EXPECT_EQ(preset_gib_32k_f16("llama-3.1-70b"), "9.77 GiB");
  EXPECT_EQ(preset_gib_32k_f16("llama-3.1-405b"), "15.38 GiB");
  EXPECT_EQ(preset_gib_32k_f16("qwen-2.5-72b"), "9.77 GiB");
  EXPECT_EQ(preset_gib_32k_f16("mistral-large-2"), "10.74 GiB");
  EXPECT_EQ(preset_gib_32k_f16("deepseek-v3"), "2.09 GiB");
}

TEST(KvPlanner, ExactBytesOfReferenceModels) {
  EXPECT_EQ(plan_for(find_kv_preset("llama-3.1-8b").shape, 32000).exact_bytes, 4194304000);
  EXPECT_EQ(plan_for(find_kv_preset("llama-3.1-405b").shape, 32000).exact_bytes, 16515072000);
  EXPECT_EQ(plan_for(find_kv_preset("deepseek-v3").shape, 32000).exact_bytes, 2248704000);
}

TEST(KvPlanner, KimiK2CachesOneLatentPerLayer) {
  const KVModelShape& kimi = find_kv_preset("kimi-k2").shape;
  EXPECT_EQ(kimi.vectors_per_layer(), 1);
  EXPECT_EQ(kimi.vector_elems(), 576);
  const KVPlan plan = plan_for(kimi, 32000);
  EXPECT_EQ(plan.bytes_per_token, 61 * 576 * 2);
  EXPECT_EQ(format_gib(plan.exact_bytes), "2.09 GiB");
}

TEST(KvPlanner, GroupedQueryIsHeadRatioSmallerThanMultiHead) {
  KVModelShape gqa = find_kv_preset("llama-3.1-8b").shape;
  KVModelShape mha = gqa;
  mha.n_kv_heads = mha.n_heads;
  const KVPlan gqa_plan = plan_for(gqa, 4096);
  const KVPlan mha_plan = plan_for(mha, 4096);
  EXPECT_EQ(mha_plan.exact_bytes, gqa_plan.exact_bytes * (gqa.n_heads / gqa.n_kv_heads));
  EXPECT_EQ(mha_plan.exact_bytes, 4 * gqa_plan.exact_bytes);
}

TEST(KvPlanner, PagedSizeRoundsEachSequenceUpToWholeBlocks) {
  const KVModelShape& shape = find_kv_preset("llama-3.1-8b").shape;
  const KVPlan plan = plan_for(shape, 1000, KVType::F16, 3, 16);
  EXPECT_EQ(plan.bytes_per_token, 131072);
  EXPECT_EQ(plan.bytes_per_block, 16 * 131072);
  EXPECT_EQ(plan.allocated_tokens_per_seq, 1008);  // 63 pages
  EXPECT_EQ(plan.exact_bytes, int64_t{3} * 1000 * 131072);
  EXPECT_EQ(plan.allocated_bytes, int64_t{3} * 1008 * 131072);
  // A context that fills its last page exactly is not rounded.
  const KVPlan whole = plan_for(shape, 32000, KVType::F16, 1, 16);
  EXPECT_EQ(whole.allocated_bytes, whole.exact_bytes);
  EXPECT_EQ(plan_for(shape, 1, KVType::F16, 1, 256).allocated_tokens_per_seq, 256);
}

TEST(KvPlanner, QuantizedTypesStoreWholeBlocksWithScales) {
  const KVModelShape& shape = find_kv_preset("llama-3.1-8b").shape;
  // 128-dim vector in q8_0: 4 blocks of 32 int8 + an fp16 scale = 136 bytes.
  EXPECT_EQ(kv_vector_bytes(KVType::Q8_0, 128), 136);
  EXPECT_EQ(kv_vector_bytes(KVType::FP8, 128), 132);
  EXPECT_EQ(kv_vector_bytes(KVType::Q4_0, 128), 72);
  EXPECT_EQ(kv_vector_bytes(KVType::Q8_0, 80), 3 * 34);  // a ragged tail costs a whole block
  const KVPlan q8 = plan_for(shape, 32000, KVType::Q8_0);
  EXPECT_EQ(q8.bytes_per_token, 2 * 32 * 8 * 136);
  EXPECT_EQ(q8.exact_bytes * 32, plan_for(shape, 32000, KVType::F16).exact_bytes * 17);  // 34/32 vs 2 bytes
  EXPECT_EQ(format_gib(q8.exact_bytes), "2.08 GiB");
  EXPECT_EQ(parse_kv_type("Q8_0", "--kv-type"), KVType::Q8_0);
  expect_error_containing([] { parse_kv_type("q3", "--kv-type"); }, "--kv-type: unknown KV type 'q3'");
}

TEST(KvPlanner, SequencesThatFitInAMemoryBudget) {
  const KVModelShape& shape = find_kv_preset("llama-3.1-8b").shape;
  KVPlanRequest request;
  request.ctx = 1000;  // 1008 tokens allocated = 132,120,576 bytes per sequence
  const KVPlan plan = plan_kv_cache(shape, request);
  // 80 GiB - 16 GiB = 68,719,476,736 bytes; / 132,120,576 = 520.1 -> 520.
  const KVMemoryFit fit = fit_kv_in_memory(plan, request, 80 * kGiB, 16 * kGiB);
  EXPECT_EQ(fit.free_bytes, 64 * kGiB);
  EXPECT_EQ(fit.sequences, 520);
  // 64 GiB / 2 MiB per page = 32768 pages of 16 tokens.
  EXPECT_EQ(fit.max_tokens, 524288);
  const KVMemoryFit none = fit_kv_in_memory(plan, request, 8 * kGiB, 16 * kGiB);
  EXPECT_EQ(none.free_bytes, 0);
  EXPECT_EQ(none.sequences, 0);
  EXPECT_EQ(none.max_tokens, 0);
}

TEST(KvPlanner, ParsesSizeStrings) {
  EXPECT_EQ(parse_byte_size("80GiB", "--mem"), 80 * kGiB);
  EXPECT_EQ(parse_byte_size("16gib", "--mem"), 16 * kGiB);
  EXPECT_EQ(parse_byte_size("500MB", "--mem"), 500000000);
  EXPECT_EQ(parse_byte_size("123456", "--mem"), 123456);
  EXPECT_EQ(parse_byte_size("42B", "--mem"), 42);
  EXPECT_EQ(parse_byte_size("1.5 GiB", "--mem"), 3 * kGiB / 2);
  EXPECT_EQ(parse_byte_size("2KiB", "--mem"), 2048);
  EXPECT_EQ(parse_byte_size("1TB", "--mem"), 1000000000000);
  EXPECT_EQ(parse_byte_size("0.001KiB", "--mem"), 1);  // fractions round down
}

TEST(KvPlanner, RejectsBadSizeStrings) {
  expect_error_containing([] { parse_byte_size("", "--mem"); }, "--mem: expected a size");
  expect_error_containing([] { parse_byte_size("GiB", "--mem"); }, "--mem: expected a size");
  expect_error_containing([] { parse_byte_size("-4GiB", "--weights-bytes"); },
                          "--weights-bytes: size must not be negative");
  expect_error_containing([] { parse_byte_size("80 gigs", "--mem"); }, "--mem: unknown size unit 'gigs'");
  expect_error_containing([] { parse_byte_size("80X", "--mem"); }, "unknown size unit 'X'");
  EXPECT_EQ(parse_byte_size("80G", "--mem"), int64_t{80} << 30);  // one letter: docker's and the JVM's binary units
  EXPECT_EQ(parse_byte_size("512m", "--mem"), int64_t{512} << 20);
  expect_error_containing([] { parse_byte_size("1.5", "--mem"); }, "not a whole number of bytes");
  expect_error_containing([] { parse_byte_size("99999999999TiB", "--mem"); }, "--mem is too large");
  expect_error_containing([] { parse_byte_size("12GiB34", "--mem"); }, "unknown size unit");
}

TEST(KvPlanner, RejectsBadRequestsAndPresets) {
  const KVModelShape& shape = find_kv_preset("llama-3.1-8b").shape;
  expect_error_containing([&] { plan_for(shape, -5); }, "--ctx must be positive, got -5");
  expect_error_containing([&] { plan_for(shape, 0); }, "--ctx must be positive");
  expect_error_containing([&] { plan_for(shape, 16, KVType::F16, 0); }, "--batch must be positive");
  expect_error_containing([&] { plan_for(shape, 16, KVType::F16, 1, 0); }, "--block-size must be positive");
  expect_error_containing([&] { plan_for(shape, int64_t{1} << 50, KVType::F32, 1 << 20); }, "overflows");
  expect_error_containing([] { find_kv_preset("llama-9"); }, "--preset: unknown preset 'llama-9'");
  EXPECT_EQ(find_kv_preset("DeepSeek-V3").id, "deepseek-v3");
}

TEST(KvPlanner, ReadsShapeFromGgufMetadata) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "tiny-llama");
  w.set_u32("llama.block_count", 4);
  w.set_u32("llama.embedding_length", 256);
  w.set_u32("llama.attention.head_count", 8);
  w.set_u32("llama.attention.head_count_kv", 2);
  w.set_u32("llama.feed_forward_length", 512);
  w.set_u32("llama.context_length", 1024);
  w.set_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b"});
  TempFile f(".gguf");
  w.write(f.path());
  GGUFFile file(f.path());
  const KVModelShape shape = kv_shape_from_config(ModelConfig::from_gguf(file));
  EXPECT_EQ(shape.name, "tiny-llama");
  EXPECT_EQ(shape.n_layers, 4);
  EXPECT_EQ(shape.n_kv_heads, 2);
  EXPECT_EQ(shape.head_dim, 32);
  EXPECT_EQ(shape.context_length, 1024);
  // 2 (K, V) x 4 layers x 2 KV heads x 32 dims x 2 bytes.
  const KVPlan plan = plan_for(shape, 1000);
  EXPECT_EQ(plan.bytes_per_token, 1024);
  EXPECT_EQ(plan.exact_bytes, 1024000);
  EXPECT_EQ(plan.allocated_bytes, 1008 * 1024);
}

TEST(KvPlanner, CommandPrintsTableJsonAndErrors) {
  const CommandResult table = run_kvserve("kv-size --preset llama-3.1-8b --ctx 32000");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("3.91 GiB"), std::string::npos) << table.output;
  const CommandResult json =
      run_kvserve("kv-size --preset deepseek-v3 --ctx 32000 --json --mem 80GiB --weights-bytes 0");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_NE(json.output.find("\"bytes\": 2248704000"), std::string::npos) << json.output;
  const CommandResult list = run_kvserve("kv-size --list-presets");
  EXPECT_NE(list.output.find("kimi-k2"), std::string::npos) << list.output;
  for (const char* bad : {"kv-size --preset nope", "kv-size --preset kimi-k2 --ctx -5",
                          "kv-size --preset kimi-k2 --mem 80GB --weights-bytes lots", "kv-size"}) {
    const CommandResult r = run_kvserve(bad);
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("kvserve: error:"), std::string::npos) << bad << ": " << r.output;
  }
}

// Gemma 3 270M (18 layers, 15 sliding with a 512-key window, one K/V head of
// 256): the sliding layers keep min(ctx, 512) positions exactly, and
// ceil((512 + 512) / 16) + 1 = 65 pages per sequence paged.
TEST(KvPlanner, SlidingLayersKeepAWindowPlusAChunk) {
  KVModelShape s;
  s.name = "Gemma 3 270M";
  s.n_layers = 18;
  s.n_heads = 4;
  s.n_kv_heads = 1;
  s.head_dim = 256;
  s.context_length = 32768;
  s.n_sliding_layers = 15;
  s.sliding_window = 512;
  const KVPlan plan = plan_for(s, 4096);
  EXPECT_EQ(plan.bytes_per_token, 18 * 1024);
  EXPECT_EQ(plan.sliding_pages_per_seq, 65);
  EXPECT_EQ(plan.exact_bytes_per_seq, 1024 * (3 * 4096 + 15 * 512));
  EXPECT_EQ(plan.allocated_bytes_per_seq, 1024 * 16 * (3 * 256 + 15 * 65));
  EXPECT_EQ(plan.every_position_bytes_per_seq, 18 * 1024 * 4096);
  // A context inside the window: nothing to free.
  const KVPlan short_plan = plan_for(s, 300);
  EXPECT_EQ(short_plan.allocated_bytes_per_seq, short_plan.every_position_bytes_per_seq);
  EXPECT_EQ(sliding_blocks_per_sequence(512, 512, 16), 65);
  EXPECT_EQ(sliding_blocks_per_sequence(48, 1, 8), 8);
  EXPECT_EQ(sliding_blocks_per_sequence(7, 9, 8), 3);
  KVPlanRequest huge_chunk;
  huge_chunk.ctx = 4096;
  huge_chunk.chunk = INT64_MAX;
  const KVPlan all = plan_kv_cache(s, huge_chunk);  // no overflow: the sliding layers keep every page
  EXPECT_EQ(all.allocated_bytes_per_seq, all.every_position_bytes_per_seq);
  KVPlanRequest bad;
  bad.ctx = 100;
  bad.chunk = 0;
  EXPECT_THROW(plan_kv_cache(s, bad), Error);
}
