// Pipeline messages as untrusted bytes (parallel/pipeline_messages.h): every
// truncation, a count or token number that overflows when multiplied, a block
// id outside the pool, positions the page table does not cover and a setup
// of impossible sizes are kvserve::Error naming what is wrong, never a crash;
// a stage given such a step fails that step on rank 0 and goes on.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "core/error.h"
#include "model/model.h"
#include "parallel/loopback_communicator.h"
#include "parallel/pipeline_messages.h"
#include "parallel/pipeline_stage.h"
#include "test_util.h"

using namespace kvserve;

namespace {

constexpr StepLimits kLimits{.dim = 8, .n_blocks = 16, .block_size = 4};
constexpr int64_t kStep = 1;  // the step kind's word

// A message built word by word, as a hostile or broken sender would.
class RawMessage {
 public:
  RawMessage& i64(int64_t v) { return put(v); }
  RawMessage& block(BlockId v) { return put(v); }
  RawMessage& floats(size_t n) {
    bytes_.resize(bytes_.size() + n * sizeof(float));
    return *this;
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  template <typename T>
  RawMessage& put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  std::vector<std::byte> bytes_;
};

// One chunk of `n` tokens at pos0 over `table`, with no copies, and its activations.
RawMessage one_chunk(int64_t n, int64_t pos0, std::vector<BlockId> table, int64_t logits_rows = 1) {
  RawMessage m;
  m.i64(kStep).i64(0).i64(1).i64(n).i64(pos0).i64(logits_rows).i64(static_cast<int64_t>(table.size()));
  for (const BlockId b : table) m.block(b);
  if (n > 0 && n < 1024) m.floats(static_cast<size_t>(n * kLimits.dim));
  return m;
}

std::string decode_error(const std::vector<std::byte>& bytes, const StepLimits& limits = kLimits) {
  try {
    decode_step(bytes, limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "(decoded)";
}

// A valid step of two chunks and two block copies.
std::vector<std::byte> valid_step() {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  const std::vector<BlockId> table_a = {0, 1}, table_b = {7};
  const SequenceChunk chunks[] = {{std::span(tokens).first(3), 2, table_a, true, 2},
                                  {std::span(tokens).last(2), 0, table_b, false, 1}};
  const BlockCopy copies[] = {{3, 4}, {5, 6}};
  const std::vector<float> activations(5 * kLimits.dim, 0.5f);
  std::vector<std::byte> bytes;
  encode_step(copies, chunks, activations, bytes);
  return bytes;
}

}  // namespace

TEST(PipelineMessages, AValidStepRoundTrips) {
  const StepMessage m = decode_step(valid_step(), kLimits);
  ASSERT_EQ(m.copies.size(), 2u);
  EXPECT_EQ(m.copies[1].src, 5);
  ASSERT_EQ(m.chunks.size(), 2u);
  EXPECT_EQ(m.chunks[0].pos0, 2);
  EXPECT_EQ(m.chunks[0].logits_rows, 2);
  EXPECT_EQ(m.chunks[1].block_table, std::vector<BlockId>{7});
  EXPECT_EQ(m.n_tokens(), 5);
  EXPECT_EQ(m.activations.size(), 5u * kLimits.dim);
}

TEST(PipelineMessages, EveryTruncationIsAnError) {
  const std::vector<std::byte> bytes = valid_step();
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<std::byte> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(decode_step(cut, kLimits), Error) << n << " of " << bytes.size() << " bytes";
  }
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW(decode_step(longer, kLimits), Error);
}

TEST(PipelineMessages, TokenCountsThatOverflowWhenMultipliedAreErrors) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  // n_tokens * dim * 4 wraps to a small number (2^62 * 8 * 4 = 2^67 = 0 mod 2^64).
  for (const int64_t n : {int64_t{1} << 62, max, max / 8 + 1, int64_t{1} << 40}) {
    const std::string error = decode_error(one_chunk(n, 0, {0}).bytes());
    EXPECT_NE(error.find("tokens"), std::string::npos) << n << ": " << error;
  }
  // Two chunks whose token counts sum past int64.
  RawMessage two;
  two.i64(kStep).i64(0).i64(2);
  for (int c = 0; c < 2; ++c) two.i64(max - 1).i64(0).i64(0).i64(1).block(0);
  EXPECT_NE(decode_error(two.bytes()).find("tokens"), std::string::npos);
  // Position + tokens past int64, and a table whose coverage overflows.
  EXPECT_NE(decode_error(one_chunk(2, max - 1, {0}).bytes()).find("positions"), std::string::npos);
  const StepLimits huge_blocks{.dim = 8, .n_blocks = 1, .block_size = max / 2};
  EXPECT_NE(decode_error(one_chunk(2, 0, {0, 0, 0}).bytes(), huge_blocks).find("positions"), std::string::npos);
  // A width or pool whose product overflows is refused, not wrapped.
  EXPECT_THROW(decode_step(valid_step(), StepLimits{.dim = max / 2, .n_blocks = 16, .block_size = 4}), Error);
  EXPECT_THROW(decode_step(valid_step(), StepLimits{.dim = 8, .n_blocks = max / 2, .block_size = 4}), Error);
}

TEST(PipelineMessages, CountsLargerThanTheMessageAreErrors) {
  for (const int64_t count : {int64_t{-1}, int64_t{1} << 61, std::numeric_limits<int64_t>::max()}) {
    EXPECT_THROW(decode_step(RawMessage().i64(kStep).i64(count).bytes(), kLimits), Error) << count;
    EXPECT_THROW(decode_step(RawMessage().i64(kStep).i64(0).i64(count).bytes(), kLimits), Error) << count;
    RawMessage table;
    table.i64(kStep).i64(0).i64(1).i64(1).i64(0).i64(0).i64(count);
    EXPECT_THROW(decode_step(table.bytes(), kLimits), Error) << count;
  }
  // More tokens than the pool has slots (16 blocks of 4), with the bytes for them.
  const std::vector<BlockId> table(17, 0);
  EXPECT_NE(decode_error(one_chunk(65, 0, table).bytes()).find("tokens"), std::string::npos);
}

TEST(PipelineMessages, BadBlockIdsAndPositionsAreErrorsNamingThem) {
  EXPECT_EQ(decode_error(one_chunk(2, 0, {0}).bytes()), "(decoded)");
  std::string error = decode_error(one_chunk(2, 0, {16}).bytes());
  EXPECT_NE(error.find("block 16, outside the pool of 16 blocks"), std::string::npos) << error;
  error = decode_error(one_chunk(2, 0, {kNoBlock}).bytes());
  EXPECT_NE(error.find("block -1"), std::string::npos) << error;
  RawMessage copy;
  copy.i64(kStep).i64(1).block(2).block(99).i64(0);
  error = decode_error(copy.bytes());
  EXPECT_NE(error.find("a block copy names block 99"), std::string::npos) << error;
  // Positions 3..5 need two blocks of 4; a negative first position; logits rows past the chunk.
  error = decode_error(one_chunk(3, 3, {0}).bytes());
  EXPECT_NE(error.find("positions 3 + 3 with a page table of 1 blocks"), std::string::npos) << error;
  EXPECT_NE(decode_error(one_chunk(1, -1, {0}).bytes()).find("positions"), std::string::npos);
  EXPECT_NE(decode_error(one_chunk(2, 0, {0}, 3).bytes()).find("logits rows"), std::string::npos);
  EXPECT_NE(decode_error(one_chunk(2, 0, {0}, -1).bytes()).find("logits rows"), std::string::npos);
  EXPECT_NE(decode_error(one_chunk(0, 0, {0}).bytes()).find("tokens"), std::string::npos);
}

TEST(PipelineMessages, ASetupOfImpossibleSizesIsAnError) {
  PipelineSetup setup{.ranks = 2, .total_layers = 2, .dim = 8, .vocab = 32, .n_kv_heads = 1, .head_dim = 8,
                      .n_blocks = 16, .block_size = 4, .kv_type = 0, .activations = 0};
  EXPECT_EQ(PipelineSetup::decode(setup.encode()), setup);
  setup.n_blocks = 0;
  EXPECT_THROW(PipelineSetup::decode(setup.encode()), Error);
  setup.n_blocks = 16;
  setup.kv_type = -3;
  EXPECT_THROW(PipelineSetup::decode(setup.encode()), Error);
  std::vector<std::byte> short_setup = setup.encode();
  short_setup.pop_back();
  EXPECT_THROW(PipelineSetup::decode(short_setup), Error);
}

TEST(PipelineMessages, AStageGivenABadStepFailsThatStepOnRankZeroAndGoesOn) {
  test_util::TempFile file(".gguf");
  test_util::write_synth_model(file.path());
  LoopbackGroup group(2);
  const auto stage = Model::load(file.path(), ModelLoadOptions{.pipeline_rank = 1, .pipeline_ranks = 2});
  std::string stage_error;
  std::thread thread([&] {
    try {
      run_pipeline_stage(*stage, group.rank(1), std::chrono::seconds(10));
    } catch (const std::exception& e) {
      stage_error = e.what();
    }
  });
  Communicator& rank0 = group.rank(0);
  const auto timeout = std::chrono::seconds(10);
  std::vector<std::byte> bytes = pipeline_setup(*stage, 2, {16, 4, KVType::F32}).encode();
  rank0.broadcast(0, bytes, timeout);
  rank0.recv(1, kPipelineReplyTag, bytes, timeout);
  decode_reply(bytes, 1, {});  // ready
  const int64_t dim = stage->config().dim;
  for (const BlockId bad : {BlockId{16}, BlockId{-7}}) {
    RawMessage step;
    step.i64(kStep).i64(0).i64(1).i64(1).i64(0).i64(1).i64(1).block(bad).floats(static_cast<size_t>(dim));
    rank0.send(1, kPipelineStepTag, step.bytes(), timeout);
    rank0.recv(1, kPipelineReplyTag, bytes, timeout);
    try {
      decode_reply(bytes, 1, {});
      ADD_FAILURE() << "block " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("block " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  rank0.send(1, kPipelineStepTag, encode_shutdown(), timeout);
  end_pipeline(rank0, timeout);
  thread.join();
  EXPECT_EQ(stage_error, "");
}
