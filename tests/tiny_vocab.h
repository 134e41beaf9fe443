#pragma once
// Small tokenizers built in memory, shared by the hostile-input tests and the
// fuzz targets (tests/fuzz/): a byte-level BPE vocabulary (the synth one, with
// ChatML control tokens) and a SentencePiece one with byte fallback. Bytes
// that a GGUFFile must read from a path go into an anonymous memory file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::test_util {

// Bytes in an anonymous in-memory file, readable through path() while it lives.
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size) : fd_(::memfd_create("kvserve_fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) throw Error("memfd_create failed");
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) throw Error("writing a memory file failed");
      done += static_cast<size_t>(n);
    }
  }
  explicit MemoryFile(const std::vector<uint8_t>& bytes) : MemoryFile(bytes.data(), bytes.size()) {}
  ~MemoryFile() { ::close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// Tokenizer metadata of a byte-level BPE vocabulary (the synth one, maybe
// with tokens appended): no BOS.
inline void add_bpe_vocab(GGUFWriter& w, const ByteBpeVocab& vocab) {
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt2");
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  w.set_string_array("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
}

// Tokenizer metadata of the synth byte-level BPE vocabulary (vocab_size >= 259), its BOS the end token.
inline void add_bpe_vocab(GGUFWriter& w, int vocab_size) {
  const ByteBpeVocab vocab = build_synth_vocab(vocab_size);
  add_bpe_vocab(w, vocab);
  w.set_u32("tokenizer.ggml.bos_token_id", vocab.eos_id);
}

// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte pieces, then a
// few scored pieces (so that merging happens) and a control token.
inline void add_spm_vocab(GGUFWriter& w) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    constexpr char kHex[] = "0123456789ABCDEF";
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    types.push_back(6);
    scores.push_back(0);
  }
  const char* const pieces[] = {"\xE2\x96\x81", "e", "t", "a", "he", "\xE2\x96\x81t", "\xE2\x96\x81the", "in", "er",
                                "\xC3\xA9", "\xE4\xB8\x80", "<|im_end|>"};
  float score = -1;
  for (const char* piece : pieces) {
    tokens.push_back(piece);
    types.push_back(std::string(piece) == "<|im_end|>" ? 3 : 1);
    scores.push_back(score -= 0.5f);
  }
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
}

// A whole llama model of a few KB: the SentencePiece vocabulary, one block
// of width 4 (f32 weights, all 0.5), a ChatML-style chat template. The fuzz
// targets' GGUF seed and the hostile-input tests start from it.
inline GGUFWriter tiny_model_writer() {
  constexpr int64_t kDim = 4, kFfn = 8;
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.context_length", 64);
  w.set_u32("llama.embedding_length", kDim);
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.feed_forward_length", kFfn);
  w.set_u32("llama.attention.head_count", 1);
  w.set_u32("llama.attention.head_count_kv", 1);
  w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  add_spm_vocab(w);
  w.set_string("tokenizer.chat_template",
               "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  const int64_t vocab = 3 + 256 + 12;
  auto tensor = [&w](const std::string& name, std::vector<int64_t> ne) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    w.add_f32_tensor(name, ne, std::vector<float>(static_cast<size_t>(n), 0.5f));
  };
  tensor("token_embd.weight", {kDim, vocab});
  tensor("output_norm.weight", {kDim});
  for (const char* name : {"attn_norm", "ffn_norm"}) tensor(std::string("blk.0.") + name + ".weight", {kDim});
  for (const char* name : {"attn_q", "attn_k", "attn_v", "attn_output"})
    tensor(std::string("blk.0.") + name + ".weight", {kDim, kDim});
  tensor("blk.0.ffn_gate.weight", {kDim, kFfn});
  tensor("blk.0.ffn_up.weight", {kDim, kFfn});
  tensor("blk.0.ffn_down.weight", {kFfn, kDim});
  return w;
}

inline Tokenizer tokenizer_from(const GGUFWriter& w) {
  const MemoryFile file(w.serialize());
  return Tokenizer::from_gguf(GGUFFile(file.path()));
}

inline Tokenizer tiny_bpe_tokenizer(int vocab_size = 400) {
  GGUFWriter w;
  add_bpe_vocab(w, vocab_size);
  return tokenizer_from(w);
}

inline Tokenizer tiny_spm_tokenizer() {
  GGUFWriter w;
  add_spm_vocab(w);
  return tokenizer_from(w);
}

}  // namespace kvserve::test_util
