#pragma once
// Imports llama2.c checkpoints (Karpathy's .bin formats) into GGUF with the
// "llama" architecture, and llama2.c tokenizer.bin files into SentencePiece-
// style GGUF vocabulary metadata.
//
// Supported checkpoint formats:
//  - version 0 ("legacy"): 7 int32 header, f32 tensors, a negative vocab_size
//    meaning a separate classifier follows the (skipped) RoPE tables;
//  - version 1: "ak42" magic, 256-byte header with a shared_classifier byte,
//    f32 tensors (norms first);
//  - version 2: as version 1 plus a group size; norms in f32, matrices as
//    int8 values followed by one f32 scale per group of the flattened tensor.
// llama2.c's RoPE pairs adjacent elements, which is the engine's layout for
// arch "llama", so wq/wk are copied without permutation.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kvserve {

struct Llama2cConfig {
  int version = 0;  // 0 legacy, 1 f32, 2 q8_0 groups
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // always positive here
  int32_t seq_len = 0;
  bool shared_classifier = true;
  int32_t group_size = 0;  // version 2 only
  size_t header_bytes = 0; // where the first tensor starts

  int32_t head_dim() const { return dim / n_heads; }
  int32_t kv_dim() const { return n_kv_heads * head_dim(); }
};

// Reads and validates a checkpoint's header; throws kvserve::Error naming
// the file and the offending field.
Llama2cConfig read_llama2c_config(const std::string& path);

// A llama2.c tokenizer.bin turned into SentencePiece GGUF conventions.
struct Llama2cVocab {
  std::vector<std::string> tokens;  // U+2581 in place of spaces
  std::vector<float> scores;
  std::vector<int32_t> token_types; // 1 normal, 2 unknown, 3 control, 6 byte
};

// Reads `vocab_size` entries (the count comes from the checkpoint: the file
// does not store it). Throws kvserve::Error naming the file and entry.
Llama2cVocab read_llama2c_tokenizer(const std::string& path, int32_t vocab_size);
// <unk>, <s>, </s>, the 256 byte tokens, then "<unused_N>" up to vocab_size.
Llama2cVocab make_placeholder_vocab(int32_t vocab_size);

struct Llama2cOptions {
  std::string checkpoint_path;
  std::string output_path;
  std::string tokenizer_path;  // empty: write a placeholder vocabulary
  DType type = DType::F32;     // for the matrices; norms always stay f32
  std::string model_name;      // general.name; empty: the checkpoint's file stem
};

struct Llama2cReport {
  Llama2cConfig config;
  size_t tensor_count = 0;
  // Matrices written as f32 because their rows are not a whole number of
  // blocks of the requested type (e.g. hidden_dim 172 with q8_0).
  std::vector<std::string> kept_f32;
  bool placeholder_vocab = false;
};

// Converts options.checkpoint_path to a GGUF file at options.output_path.
// A truncated checkpoint throws kvserve::Error naming the file and the tensor
// that was cut.
Llama2cReport convert_llama2c(const Llama2cOptions& options);

}  // namespace kvserve
