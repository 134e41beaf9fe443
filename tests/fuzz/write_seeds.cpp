// Writes the generated seeds of the fuzz corpora (tests/fuzz/corpus/): the
// tiny model of tests/tiny_vocab.h as a GGUF file, and valid pipeline
// messages (a step, a shutdown, a setup, replies). Run once after changing them:
//   build-fuzz/fuzz_write_seeds tests/fuzz/corpus
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "parallel/pipeline_messages.h"
#include "tests/fuzz/pipeline_seed_limits.h"
#include "tests/tiny_vocab.h"

namespace {

using namespace kvserve;

void write_bytes(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

void write_pipeline_seeds(const std::string& dir) {
  const StepLimits& limits = pipeline_fuzz::kSeedLimits;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  const std::vector<BlockId> table_a = {0, 1}, table_b = {7};
  const SequenceChunk chunks[] = {{std::span(tokens).first(3), 2, table_a, true, 2},
                                  {std::span(tokens).last(2), 0, table_b, false, 1}};
  const BlockCopy copies[] = {{3, 4}, {5, 6}};
  std::vector<std::byte> bytes;
  encode_step(copies, chunks, std::vector<float>(static_cast<size_t>(5 * limits.dim), 0.5f), bytes);
  write_bytes(dir + "/step.bin", bytes);
  encode_step({}, std::span(chunks).first(1), std::vector<float>(static_cast<size_t>(3 * limits.dim), 1.0f), bytes);
  write_bytes(dir + "/step_one_chunk.bin", bytes);
  write_bytes(dir + "/shutdown.bin", encode_shutdown());
  const PipelineSetup setup{.ranks = 2, .total_layers = 4, .dim = limits.dim, .vocab = 32, .n_kv_heads = 2,
                            .head_dim = 4, .n_blocks = limits.n_blocks, .block_size = limits.block_size,
                            .kv_type = 0, .activations = 0};
  write_bytes(dir + "/setup.bin", setup.encode());
  encode_logits_reply(std::vector<float>(pipeline_fuzz::kSeedLogits, 0.25f), bytes);
  write_bytes(dir + "/reply_logits.bin", bytes);
  write_bytes(dir + "/reply_error.bin", encode_error_reply("rank 1: out of blocks"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  kvserve::test_util::tiny_model_writer().write(std::string(argv[1]) + "/gguf/tiny_model.gguf");
  write_pipeline_seeds(std::string(argv[1]) + "/pipeline_messages");
  return 0;
}
