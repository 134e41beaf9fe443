// Random-weight models: every tiny preset in every type reloads with the
// expected tensors and metadata, files are deterministic, and the generated
// byte-level BPE vocabulary is exact and self-consistent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "kernels/quantize.h"
#include "model/gguf.h"
#include "model/synth.h"

namespace fs = std::filesystem;
using namespace kvserve;

namespace {

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("kvserve_synth_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string synth(const std::string& preset, DType type, uint64_t seed = 1, int layers = 0) {
    const std::string out = path(preset + "_" + dtype_name(type) + "_" + std::to_string(seed) + "_" +
                                 std::to_string(layers) + ".gguf");
    synthesize_model({preset, type, out, seed, layers});
    return out;
  }

  fs::path dir_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> tensor_values(const TensorView& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.row(r), values.data() + r * t.cols(), t.cols());
  return values;
}

// name -> ne, as the engine's loader expects them.
std::map<std::string, std::vector<int64_t>> expected_shapes(const SynthPreset& p, int layers) {
  const int64_t q = static_cast<int64_t>(p.n_heads) * p.head_dim();
  const int64_t kv = static_cast<int64_t>(p.n_kv_heads) * p.head_dim();
  std::map<std::string, std::vector<int64_t>> shapes = {{"token_embd.weight", {p.dim, p.vocab_size}},
                                                        {"output_norm.weight", {p.dim}}};
  if (!p.tied_embeddings) shapes["output.weight"] = {p.dim, p.vocab_size};
  for (int l = 0; l < layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    shapes[b + "attn_norm.weight"] = {p.dim};
    shapes[b + "attn_q.weight"] = {p.dim, q};
    shapes[b + "attn_k.weight"] = {p.dim, kv};
    shapes[b + "attn_v.weight"] = {p.dim, kv};
    shapes[b + "attn_output.weight"] = {q, p.dim};
    shapes[b + "ffn_norm.weight"] = {p.dim};
    shapes[b + "ffn_gate.weight"] = {p.dim, p.ffn_dim};
    shapes[b + "ffn_up.weight"] = {p.dim, p.ffn_dim};
    shapes[b + "ffn_down.weight"] = {p.ffn_dim, p.dim};
    if (p.qkv_bias) {
      shapes[b + "attn_q.bias"] = {q};
      shapes[b + "attn_k.bias"] = {kv};
      shapes[b + "attn_v.bias"] = {kv};
    }
  }
  return shapes;
}

void expect_model_metadata(const GGUFFile& f, const SynthPreset& p, int layers) {
  const std::string a = p.arch;
  EXPECT_EQ(f.get_string("general.architecture"), a);
  EXPECT_EQ(f.get_uint(a + ".embedding_length"), static_cast<uint64_t>(p.dim));
  EXPECT_EQ(f.get_uint(a + ".block_count"), static_cast<uint64_t>(layers));
  EXPECT_EQ(f.get_uint(a + ".feed_forward_length"), static_cast<uint64_t>(p.ffn_dim));
  EXPECT_EQ(f.get_uint(a + ".attention.head_count"), static_cast<uint64_t>(p.n_heads));
  EXPECT_EQ(f.get_uint(a + ".attention.head_count_kv"), static_cast<uint64_t>(p.n_kv_heads));
  EXPECT_EQ(f.get_uint(a + ".context_length"), static_cast<uint64_t>(p.context_length));
  EXPECT_EQ(f.get_uint(a + ".rope.dimension_count"), static_cast<uint64_t>(p.head_dim()));
  EXPECT_EQ(f.get_uint(a + ".vocab_size"), static_cast<uint64_t>(p.vocab_size));
  EXPECT_FLOAT_EQ(f.get_float(a + ".rope.freq_base"), p.rope_theta);
  EXPECT_FLOAT_EQ(f.get_float(a + ".attention.layer_norm_rms_epsilon"), p.rms_eps);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), static_cast<size_t>(p.vocab_size));
  EXPECT_EQ(f.get_number_array("tokenizer.ggml.token_type").size(), static_cast<size_t>(p.vocab_size));
  const uint64_t eos = f.get_uint("tokenizer.ggml.eos_token_id");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")[eos], "<|endoftext|>");
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), eos);
}

// Every merge joins two tokens into a token; every learnt token comes from
// some merge; tokens and merges are unique.
void expect_consistent_vocab(const ByteBpeVocab& v, int vocab_size) {
  ASSERT_EQ(v.tokens.size(), static_cast<size_t>(vocab_size));
  ASSERT_EQ(v.token_types.size(), v.tokens.size());
  const std::unordered_set<std::string> tokens(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(tokens.size(), v.tokens.size()) << "duplicate tokens";
  EXPECT_EQ(std::set<std::string>(v.merges.begin(), v.merges.end()).size(), v.merges.size()) << "duplicate merges";
  std::unordered_set<std::string> merged;
  for (const std::string& m : v.merges) {
    const auto space = m.find(' ');
    ASSERT_NE(space, std::string::npos) << m;
    ASSERT_EQ(m.find(' ', space + 1), std::string::npos) << m;
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    ASSERT_TRUE(tokens.count(left)) << m;
    ASSERT_TRUE(tokens.count(right)) << m;
    ASSERT_TRUE(tokens.count(left + right)) << m;
    merged.insert(left + right);
  }
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (id < 256) {
      EXPECT_EQ(v.tokens[id], gpt2_byte_symbol(static_cast<uint8_t>(id)));
    } else if (v.token_types[id] == 1) {
      EXPECT_TRUE(merged.count(v.tokens[id])) << "token " << id << " " << v.tokens[id] << " has no merge";
    }
  }
  EXPECT_EQ(v.tokens[v.eos_id], "<|endoftext|>");
  EXPECT_EQ(v.token_types[v.eos_id], 3);
  EXPECT_EQ(v.tokens.back(), "<|im_end|>");
}

}  // namespace

TEST_F(SynthTest, TinyPresetsInEveryType) {
  for (const std::string preset_name : {"tiny-llama", "tiny-qwen2"}) {
    const SynthPreset& p = find_synth_preset(preset_name);
    for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
      SCOPED_TRACE(preset_name + " " + dtype_name(type));
      GGUFFile f(synth(preset_name, type));
      expect_model_metadata(f, p, p.n_layers);
      const auto shapes = expected_shapes(p, p.n_layers);
      ASSERT_EQ(f.tensors().size(), shapes.size());
      for (const TensorView& t : f.tensors()) {
        ASSERT_TRUE(shapes.count(t.name)) << t.name;
        const std::vector<int64_t>& ne = shapes.at(t.name);
        ASSERT_EQ(t.n_dims, static_cast<int>(ne.size())) << t.name;
        for (size_t d = 0; d < ne.size(); ++d) EXPECT_EQ(t.ne[d], ne[d]) << t.name;
        EXPECT_EQ(t.type, t.n_dims == 1 ? DType::F32 : type) << t.name;
      }
    }
  }
}

TEST_F(SynthTest, WeightsHaveRealisticScale) {
  const SynthPreset& p = find_synth_preset("tiny-llama");
  GGUFFile f(synth("tiny-llama", DType::F32));
  for (const std::string name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"}) {
    const TensorView& t = f.tensor(name);
    const std::vector<float> v = tensor_values(t);
    double sum = 0, sum_sq = 0;
    for (float x : v) {
      sum += x;
      sum_sq += static_cast<double>(x) * x;
    }
    const double mean = sum / v.size();
    const double std_dev = std::sqrt(sum_sq / v.size() - mean * mean);
    const double want = 1.0 / std::sqrt(static_cast<double>(t.cols()));
    EXPECT_NEAR(mean, 0.0, 0.1 * want) << name;
    EXPECT_NEAR(std_dev, want, 0.05 * want) << name;
  }
  for (float x : tensor_values(f.tensor("output_norm.weight"))) EXPECT_EQ(x, 1.0f);
  EXPECT_EQ(f.tensor("blk.1.ffn_norm.weight").numel(), p.dim);
}

TEST_F(SynthTest, DeterministicForASeed) {
  const std::string a = synth("tiny-qwen2", DType::Q4_0, 7);
  const std::string b = path("again.gguf");
  synthesize_model({"tiny-qwen2", DType::Q4_0, b, 7, 0});
  EXPECT_EQ(read_bytes(a), read_bytes(b));
  EXPECT_NE(read_bytes(a), read_bytes(synth("tiny-qwen2", DType::Q4_0, 8)));
}

TEST_F(SynthTest, LayerOverrideKeepsTheFirstBlocks) {
  GGUFFile full(synth("tiny-llama", DType::Q8_0, 3));
  GGUFFile one(synth("tiny-llama", DType::Q8_0, 3, 1));
  EXPECT_EQ(one.get_uint("llama.block_count"), 1u);
  EXPECT_EQ(one.find_tensor("blk.1.attn_q.weight"), nullptr);
  for (const std::string name : {"blk.0.attn_q.weight", "token_embd.weight", "output.weight"}) {
    const TensorView& a = full.tensor(name);
    const TensorView& b = one.tensor(name);
    ASSERT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << name;
  }
}

TEST_F(SynthTest, ContextOverrideChangesOnlyTheContextLength) {
  const std::string out = path("tiny_ctx.gguf");
  SynthOptions options{"tiny-llama", DType::Q8_0, out, 3};
  options.context = 2048;
  synthesize_model(options);
  GGUFFile longer(out);
  GGUFFile plain(synth("tiny-llama", DType::Q8_0, 3));
  EXPECT_EQ(longer.get_uint("llama.context_length"), 2048u);
  EXPECT_EQ(plain.get_uint("llama.context_length"), 256u);
  const TensorView& a = plain.tensor("blk.1.attn_q.weight");
  const TensorView& b = longer.tensor("blk.1.attn_q.weight");
  ASSERT_EQ(a.nbytes, b.nbytes);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0);
  options.context = -1;
  EXPECT_THROW(synthesize_model(options), Error);
}

TEST_F(SynthTest, VocabularyOfTinyPresetsIsConsistent) {
  for (const char* name : {"tiny-llama", "tiny-qwen2"}) {
    const SynthPreset& p = find_synth_preset(name);
    expect_consistent_vocab(build_synth_vocab(p.vocab_size), p.vocab_size);
  }
}

TEST_F(SynthTest, VocabularyOfFullPresetsIsExactAndPadded) {
  // smollm2's 49152 exhausts the word list, so synthetic merges fill the rest.
  expect_consistent_vocab(build_synth_vocab(49152), 49152);
  expect_consistent_vocab(build_synth_vocab(151936), 151936);
}

TEST_F(SynthTest, VocabularyLearnsCommonWordsFirst) {
  const ByteBpeVocab v = build_synth_vocab(2000);
  const std::unordered_set<std::string> tokens(v.tokens.begin(), v.tokens.end());
  EXPECT_TRUE(tokens.count("\xc4\xa0the"));  // "Ġthe"
  EXPECT_TRUE(tokens.count("\xc4\xa0" "and"));
  // " the", the most frequent word, is learnt within the first few dozen merges.
  const auto the = std::find_if(v.merges.begin(), v.merges.end(), [](const std::string& m) {
    std::string joined = m;
    joined.erase(joined.find(' '), 1);
    return joined == "\xc4\xa0the";
  });
  ASSERT_NE(the, v.merges.end());
  EXPECT_LT(the - v.merges.begin(), 50);
}

TEST_F(SynthTest, ByteSymbolsFollowGpt2) {
  EXPECT_EQ(gpt2_byte_symbol('A'), "A");
  EXPECT_EQ(gpt2_byte_symbol(' '), "\xc4\xa0");   // U+0120 Ġ
  EXPECT_EQ(gpt2_byte_symbol('\n'), "\xc4\x8a");  // U+010A Ċ
  EXPECT_EQ(gpt2_byte_symbol(0), "\xc4\x80");     // U+0100 Ā
  EXPECT_EQ(gpt2_byte_symbol(0xAD), "\xc5\x83");  // U+0143 Ń
  EXPECT_EQ(gpt2_byte_symbol(0xE9), "\xc3\xa9");  // é stands for itself
  std::set<std::string> all;
  for (int b = 0; b < 256; ++b) all.insert(gpt2_byte_symbol(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
}

TEST_F(SynthTest, RejectsBadRequests) {
  try {
    synthesize_model({"no-such-model", DType::F32, path("x.gguf"), 1, 0});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("smollm2-135m"), std::string::npos) << e.what();
  }
  EXPECT_THROW(synthesize_model({"tiny-llama", DType::Q8_1, path("x.gguf"), 1, 0}), Error);
  EXPECT_THROW(build_synth_vocab(100), Error);
}

TEST_F(SynthTest, FullPresetsHaveTheRealShapes) {
  const SynthPreset& smol = find_synth_preset("smollm2-135m");
  EXPECT_EQ(smol.dim, 576);
  EXPECT_EQ(smol.head_dim(), 64);
  EXPECT_TRUE(smol.tied_embeddings);
  const SynthPreset& qwen = find_synth_preset("qwen2.5-0.5b");
  EXPECT_EQ(qwen.arch, "qwen2");
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_EQ(qwen.head_dim(), 64);
  EXPECT_EQ(find_synth_preset("tinyllama-1.1b").head_dim(), 64);
  EXPECT_EQ(find_synth_preset("llama3-8b-2layer").head_dim(), 128);
  EXPECT_FALSE(find_synth_preset("llama3-8b-2layer").tied_embeddings);
}

TEST_F(SynthTest, CommandLineWritesAModel) {
  const std::string out = path("cli.gguf");
  const std::string cmd = std::string(KVSERVE_BINARY) + " synth --preset tiny-qwen2 --type q8_0 --seed 5 --layers 1 -o " +
                          out + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  GGUFFile f(out);
  EXPECT_EQ(f.get_uint("qwen2.block_count"), 1u);
  EXPECT_EQ(f.get_uint("kvserve.synth_seed"), 5u);
  EXPECT_EQ(f.tensor("blk.0.attn_k.bias").type, DType::F32);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").type, DType::Q8_0);
  const std::string bad = std::string(KVSERVE_BINARY) + " synth --preset nope -o " + out + " 2> /dev/null";
  EXPECT_NE(std::system(bad.c_str()), 0);
}
