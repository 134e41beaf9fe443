// llama2.c import: the real stories260K fixture (when /work/shared/models or
// KVSERVE_SHARED_MODELS has it) and small checkpoints of every format that
// the tests write themselves, with the layout restated here independently.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/quantize.h"
#include "model/gguf.h"
#include "model/llama2c.h"

namespace fs = std::filesystem;
using namespace kvserve;

namespace {

// KVSERVE_SHARED_MODELS, else shared/ beside the clone (CI), else beside the
// folder holding the clone (a git worktree under /work/wt).
std::string shared_models_dir() {
  if (const char* env = std::getenv("KVSERVE_SHARED_MODELS")) return env;
  const std::string beside = std::string(KVSERVE_SOURCE_DIR) + "/../shared/models";
  const std::string above = std::string(KVSERVE_SOURCE_DIR) + "/../../shared/models";
  return fs::exists(beside) || !fs::exists(above) ? beside : above;
}

// A fresh directory per test, removed afterwards.
class Llama2cTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("kvserve_llama2c_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string stories_or_skip() {
    const std::string bin = shared_models_dir() + "/stories260K.bin";
    if (!fs::exists(bin)) return {};
    return bin;
  }

  fs::path dir_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
template <typename T>
void append(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

std::vector<float> tensor_values(const TensorView& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (int64_t r = 0; r < t.rows(); ++r) dequantize_row(t.type, t.row(r), values.data() + r * t.cols(), t.cols());
  return values;
}

struct CheckpointShape {
  int dim, hidden, layers, heads, kv_heads, vocab, seq;
  int kv_dim() const { return dim / heads * kv_heads; }
};

// One llama2.c tensor: its name in the file, the GGUF name of layer l (or
// the global name), its rows and columns.
struct RefTensor {
  std::string gguf;  // with "%" standing for the layer number
  bool per_layer;
  int rows, cols;
};

std::string layer_name(const std::string& pattern, int layer) {
  std::string s = pattern;
  const auto at = s.find('%');
  if (at != std::string::npos) s.replace(at, 1, std::to_string(layer));
  return s;
}

// The legacy (version 0) order from the models README.
std::vector<RefTensor> legacy_order(const CheckpointShape& s) {
  return {{"token_embd.weight", false, s.vocab, s.dim},        {"blk.%.attn_norm.weight", true, 1, s.dim},
          {"blk.%.attn_q.weight", true, s.dim, s.dim},         {"blk.%.attn_k.weight", true, s.kv_dim(), s.dim},
          {"blk.%.attn_v.weight", true, s.kv_dim(), s.dim},    {"blk.%.attn_output.weight", true, s.dim, s.dim},
          {"blk.%.ffn_norm.weight", true, 1, s.dim},           {"blk.%.ffn_gate.weight", true, s.hidden, s.dim},
          {"blk.%.ffn_down.weight", true, s.dim, s.hidden},    {"blk.%.ffn_up.weight", true, s.hidden, s.dim},
          {"output_norm.weight", false, 1, s.dim}};
}

// export.py's version 1/2 order (norms first, classifier last).
std::vector<RefTensor> versioned_order(const CheckpointShape& s, bool shared) {
  std::vector<RefTensor> order = {
      {"blk.%.attn_norm.weight", true, 1, s.dim},        {"blk.%.ffn_norm.weight", true, 1, s.dim},
      {"output_norm.weight", false, 1, s.dim},           {"token_embd.weight", false, s.vocab, s.dim},
      {"blk.%.attn_q.weight", true, s.dim, s.dim},       {"blk.%.attn_k.weight", true, s.kv_dim(), s.dim},
      {"blk.%.attn_v.weight", true, s.kv_dim(), s.dim},  {"blk.%.attn_output.weight", true, s.dim, s.dim},
      {"blk.%.ffn_gate.weight", true, s.hidden, s.dim},  {"blk.%.ffn_down.weight", true, s.dim, s.hidden},
      {"blk.%.ffn_up.weight", true, s.hidden, s.dim}};
  if (!shared) order.push_back({"output.weight", false, s.vocab, s.dim});
  return order;
}

using Expected = std::map<std::string, std::vector<float>>;

// Walks `order` over raw f32 data starting at `offset`, recording each
// tensor's values under its GGUF name.
size_t collect_f32(const std::vector<uint8_t>& file, size_t offset, const std::vector<RefTensor>& order, int layers,
                   Expected& expected) {
  for (const RefTensor& t : order) {
    for (int l = 0; l < (t.per_layer ? layers : 1); ++l) {
      std::vector<float> values(static_cast<size_t>(t.rows) * t.cols);
      std::memcpy(values.data(), file.data() + offset, values.size() * sizeof(float));
      offset += values.size() * sizeof(float);
      expected[layer_name(t.gguf, l)] = std::move(values);
    }
  }
  return offset;
}

void expect_tensors_match(const GGUFFile& gguf, const Expected& expected, float tolerance) {
  EXPECT_EQ(gguf.tensors().size(), expected.size());
  for (const auto& [name, values] : expected) {
    const TensorView* t = gguf.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->numel(), static_cast<int64_t>(values.size())) << name;
    const std::vector<float> got = tensor_values(*t);
    for (size_t i = 0; i < values.size(); ++i) {
      if (tolerance == 0.0f)
        ASSERT_EQ(got[i], values[i]) << name << " [" << i << "]";
      else
        ASSERT_NEAR(got[i], values[i], tolerance) << name << " [" << i << "]";
    }
  }
}

const CheckpointShape kStories{64, 172, 5, 8, 4, 512, 512};

}  // namespace

TEST_F(Llama2cTest, ReadsStories260KHeader) {
  const std::string bin = stories_or_skip();
  if (bin.empty()) GTEST_SKIP() << "stories260K.bin not found in " << shared_models_dir();
  const Llama2cConfig c = read_llama2c_config(bin);
  EXPECT_EQ(c.version, 0);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.header_bytes, 28u);
}

TEST_F(Llama2cTest, ConvertsStories260KExactly) {
  const std::string bin = stories_or_skip();
  if (bin.empty()) GTEST_SKIP() << "stories260K.bin not found in " << shared_models_dir();
  const std::string tok = shared_models_dir() + "/tok512.bin";
  if (!fs::exists(tok)) GTEST_SKIP() << "tok512.bin not found";
  const Llama2cReport report = convert_llama2c({bin, path("s.gguf"), tok, DType::F32, ""});
  EXPECT_EQ(report.tensor_count, 47u);
  EXPECT_FALSE(report.placeholder_vocab);

  GGUFFile gguf(path("s.gguf"));
  EXPECT_EQ(gguf.get_string("general.architecture"), "llama");
  EXPECT_EQ(gguf.get_string("general.name"), "stories260K");
  EXPECT_EQ(gguf.get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(gguf.get_uint("llama.feed_forward_length"), 172u);
  EXPECT_EQ(gguf.get_uint("llama.block_count"), 5u);
  EXPECT_EQ(gguf.get_uint("llama.attention.head_count"), 8u);
  EXPECT_EQ(gguf.get_uint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(gguf.get_uint("llama.context_length"), 512u);
  EXPECT_EQ(gguf.get_uint("llama.rope.dimension_count"), 8u);
  EXPECT_EQ(gguf.get_uint("llama.vocab_size"), 512u);
  EXPECT_FLOAT_EQ(gguf.get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_FLOAT_EQ(gguf.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(gguf.find_tensor("output.weight"), nullptr);  // tied

  const TensorView& wk = gguf.tensor("blk.3.attn_k.weight");
  EXPECT_EQ(wk.type, DType::F32);
  EXPECT_EQ(wk.ne[0], 64);
  EXPECT_EQ(wk.ne[1], 32);
  const TensorView& down = gguf.tensor("blk.0.ffn_down.weight");
  EXPECT_EQ(down.ne[0], 172);
  EXPECT_EQ(down.ne[1], 64);
  EXPECT_EQ(gguf.tensor("blk.4.ffn_norm.weight").n_dims, 1);

  const std::vector<uint8_t> raw = read_bytes(bin);
  Expected expected;
  const size_t end = collect_f32(raw, 28, legacy_order(kStories), kStories.layers, expected);
  EXPECT_EQ(end + 2 * 512 * 4 * sizeof(float), raw.size());  // then the two RoPE tables
  expect_tensors_match(gguf, expected, 0.0f);
}

TEST_F(Llama2cTest, ConvertsTok512ToSentencePieceMetadata) {
  const std::string bin = stories_or_skip();
  const std::string tok = shared_models_dir() + "/tok512.bin";
  if (bin.empty() || !fs::exists(tok)) GTEST_SKIP() << "stories260K fixtures not found";
  convert_llama2c({bin, path("s.gguf"), tok, DType::F32, ""});
  GGUFFile gguf(path("s.gguf"));
  EXPECT_EQ(gguf.get_string("tokenizer.ggml.model"), "llama");
  const auto& tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  const auto& types = gguf.get_number_array("tokenizer.ggml.token_type");
  const auto& scores = gguf.get_number_array("tokenizer.ggml.scores");
  ASSERT_EQ(tokens.size(), 512u);
  ASSERT_EQ(types.size(), 512u);
  ASSERT_EQ(scores.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(types[2], 3);
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(types[3], 6);
  EXPECT_EQ(types[258], 6);
  EXPECT_EQ(tokens[259], "\xe2\x96\x81t");  // stored as " t"
  EXPECT_EQ(types[259], 1);
  EXPECT_EQ(scores[260], -1.0);
  EXPECT_EQ(scores[511], -252.0);
  EXPECT_EQ(gguf.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(gguf.get_uint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(gguf.get_uint("tokenizer.ggml.unknown_token_id"), 0u);
  EXPECT_TRUE(gguf.get_bool("tokenizer.ggml.add_bos_token", false));
  EXPECT_TRUE(gguf.get_bool("tokenizer.ggml.add_space_prefix", false));
  EXPECT_FALSE(gguf.has("kvserve.placeholder_vocab"));
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(tokens[i].find(' '), std::string_view::npos) << tokens[i];
}

TEST_F(Llama2cTest, QuantizesStories260KWhereRowsAllow) {
  const std::string bin = stories_or_skip();
  if (bin.empty()) GTEST_SKIP() << "stories260K.bin not found";
  const Llama2cReport report = convert_llama2c({bin, path("q.gguf"), "", DType::Q8_0, ""});
  EXPECT_EQ(report.kept_f32.size(), 5u);  // ffn_down rows are 172 long
  GGUFFile gguf(path("q.gguf"));
  for (const TensorView& t : gguf.tensors()) {
    const bool vector = t.n_dims == 1;
    const bool down = t.name.find("ffn_down") != std::string::npos;
    EXPECT_EQ(t.type, vector || down ? DType::F32 : DType::Q8_0) << t.name;
  }
  const std::vector<uint8_t> raw = read_bytes(bin);
  Expected expected;
  collect_f32(raw, 28, legacy_order(kStories), kStories.layers, expected);
  expect_tensors_match(gguf, expected, 0.02f);
}

TEST_F(Llama2cTest, TruncatedCheckpointNamesTheTensor) {
  const std::string bin = stories_or_skip();
  if (bin.empty()) GTEST_SKIP() << "stories260K.bin not found";
  std::vector<uint8_t> raw = read_bytes(bin);
  // Cut inside wq of layer 2: header, embeddings, 5 attention norms, 2 full wq.
  raw.resize(28 + (512 * 64 + 5 * 64 + 2 * 64 * 64) * 4 + 100);
  write_bytes(path("cut.bin"), raw);
  try {
    convert_llama2c({path("cut.bin"), path("cut.gguf"), "", DType::F32, ""});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cut.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor wq (layer 2 of 5)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(path("cut.gguf")));
}

TEST_F(Llama2cTest, PlaceholderVocabWhenNoTokenizerGiven) {
  const std::string bin = stories_or_skip();
  if (bin.empty()) GTEST_SKIP() << "stories260K.bin not found";
  const Llama2cReport report = convert_llama2c({bin, path("p.gguf"), "", DType::F32, "custom"});
  EXPECT_TRUE(report.placeholder_vocab);
  GGUFFile gguf(path("p.gguf"));
  EXPECT_TRUE(gguf.get_bool("kvserve.placeholder_vocab", false));
  EXPECT_EQ(gguf.get_string("general.name"), "custom");
  const auto& tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  const auto& types = gguf.get_number_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(types[3 + 0x41], 6);
  EXPECT_EQ(tokens[259], "<unused_259>");
  EXPECT_EQ(tokens[511], "<unused_511>");
}

namespace {

const CheckpointShape kSmall{64, 96, 2, 4, 2, 40, 16};

struct BuiltCheckpoint {
  std::vector<uint8_t> bytes;
  Expected expected;
};

void append_header(std::vector<uint8_t>& out, const CheckpointShape& s, int version, bool shared, int group_size) {
  if (version > 0) {
    append<uint32_t>(out, 0x616b3432);
    append<int32_t>(out, version);
  }
  for (int v : {s.dim, s.hidden, s.layers, s.heads, s.kv_heads, version == 0 && !shared ? -s.vocab : s.vocab, s.seq})
    append<int32_t>(out, v);
  if (version > 0) {
    append<uint8_t>(out, shared ? 1 : 0);
    if (version == 2) append<int32_t>(out, group_size);
    out.resize(256, 0);
  }
}

// Version 2 stores matrices as int8 plus one f32 scale per group.
void append_grouped_q8(std::vector<uint8_t>& out, size_t numel, int group_size, int salt, std::vector<float>& values) {
  std::vector<float> scales(numel / group_size);
  for (size_t g = 0; g < scales.size(); ++g) scales[g] = 0.001f * static_cast<float>(g % 13 + 1 + salt);
  for (size_t i = 0; i < numel; ++i) {
    const auto q = static_cast<int8_t>(static_cast<int>((i * 7 + salt) % 255) - 127);
    append<int8_t>(out, q);
    values[i] = static_cast<float>(q) * scales[i / group_size];
  }
  for (float s : scales) append<float>(out, s);
}

void append_tensors(BuiltCheckpoint& b, const CheckpointShape& s, const std::vector<RefTensor>& order, int version,
                    int group_size, int& salt) {
  for (const RefTensor& t : order) {
    for (int l = 0; l < (t.per_layer ? s.layers : 1); ++l) {
      std::vector<float> values(static_cast<size_t>(t.rows) * t.cols);
      ++salt;
      if (version == 2 && t.rows > 1) {
        append_grouped_q8(b.bytes, values.size(), group_size, salt, values);
      } else {
        for (size_t i = 0; i < values.size(); ++i) {
          values[i] = static_cast<float>(salt) * 0.125f + static_cast<float>(i % 97) * 0.01f - 0.5f;
          append<float>(b.bytes, values[i]);
        }
      }
      b.expected[layer_name(t.gguf, l)] = std::move(values);
    }
  }
}

BuiltCheckpoint build_checkpoint(const CheckpointShape& s, int version, bool shared, int group_size = 32) {
  BuiltCheckpoint b;
  append_header(b.bytes, s, version, shared, group_size);
  int salt = 0;
  if (version > 0) {
    append_tensors(b, s, versioned_order(s, shared), version, group_size, salt);
    return b;
  }
  append_tensors(b, s, legacy_order(s), 0, group_size, salt);
  const size_t table_floats = 2 * static_cast<size_t>(s.seq) * (s.dim / s.heads / 2);
  for (size_t i = 0; i < table_floats; ++i) append<float>(b.bytes, 99.0f);  // RoPE tables, ignored
  if (!shared) append_tensors(b, s, {{"output.weight", false, s.vocab, s.dim}}, 0, group_size, salt);
  return b;
}

std::string convert_error(const std::string& checkpoint, const std::string& output,
                          const std::string& tokenizer = "") {
  try {
    convert_llama2c({checkpoint, output, tokenizer, DType::F32, ""});
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_F(Llama2cTest, Version1SeparateClassifier) {
  const BuiltCheckpoint b = build_checkpoint(kSmall, 1, false);
  write_bytes(path("v1.bin"), b.bytes);
  const Llama2cReport report = convert_llama2c({path("v1.bin"), path("v1.gguf"), "", DType::F32, ""});
  EXPECT_EQ(report.config.version, 1);
  EXPECT_FALSE(report.config.shared_classifier);
  GGUFFile gguf(path("v1.gguf"));
  ASSERT_NE(gguf.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(gguf.tensor("output.weight").ne[0], 64);
  EXPECT_EQ(gguf.tensor("output.weight").ne[1], 40);
  expect_tensors_match(gguf, b.expected, 0.0f);
}

TEST_F(Llama2cTest, Version1SharedClassifierIsTied) {
  const BuiltCheckpoint b = build_checkpoint(kSmall, 1, true);
  write_bytes(path("v1.bin"), b.bytes);
  convert_llama2c({path("v1.bin"), path("v1.gguf"), "", DType::BF16, ""});
  GGUFFile gguf(path("v1.gguf"));
  EXPECT_EQ(gguf.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(gguf.tensor("blk.1.attn_q.weight").type, DType::BF16);
  EXPECT_EQ(gguf.tensor("blk.1.attn_norm.weight").type, DType::F32);
  expect_tensors_match(gguf, b.expected, 0.02f);
}

TEST_F(Llama2cTest, Version2GroupedQ8IsDequantized) {
  const BuiltCheckpoint b = build_checkpoint(kSmall, 2, false, 32);
  write_bytes(path("v2.bin"), b.bytes);
  const Llama2cReport report = convert_llama2c({path("v2.bin"), path("v2.gguf"), "", DType::F32, ""});
  EXPECT_EQ(report.config.version, 2);
  EXPECT_EQ(report.config.group_size, 32);
  expect_tensors_match(GGUFFile(path("v2.gguf")), b.expected, 0.0f);
}

TEST_F(Llama2cTest, Version2TruncatedScalesNamed) {
  BuiltCheckpoint b = build_checkpoint(kSmall, 2, true, 32);
  b.bytes.resize(b.bytes.size() - 8);  // inside the last tensor's scales
  write_bytes(path("v2.bin"), b.bytes);
  const std::string msg = convert_error(path("v2.bin"), path("v2.gguf"));
  EXPECT_NE(msg.find("truncated: tensor w3 (layer 1 of 2)"), std::string::npos) << msg;
}

TEST_F(Llama2cTest, LegacySeparateClassifierFollowsRopeTables) {
  const BuiltCheckpoint b = build_checkpoint(kSmall, 0, false);
  write_bytes(path("v0.bin"), b.bytes);
  convert_llama2c({path("v0.bin"), path("v0.gguf"), "", DType::F16, ""});
  expect_tensors_match(GGUFFile(path("v0.gguf")), b.expected, 0.01f);

  std::vector<uint8_t> cut = b.bytes;
  cut.resize(cut.size() - 4);
  write_bytes(path("cut.bin"), cut);
  EXPECT_NE(convert_error(path("cut.bin"), path("cut.gguf")).find("tensor wcls"), std::string::npos);
}

TEST_F(Llama2cTest, RejectsInvalidHeaders) {
  CheckpointShape bad_heads = kSmall;
  bad_heads.heads = 5;
  write_bytes(path("heads.bin"), build_checkpoint(bad_heads, 1, true).bytes);
  EXPECT_NE(convert_error(path("heads.bin"), path("o.gguf")).find("n_heads = 5"), std::string::npos);

  std::vector<uint8_t> v3 = build_checkpoint(kSmall, 1, true).bytes;
  v3[4] = 3;
  write_bytes(path("v3.bin"), v3);
  EXPECT_NE(convert_error(path("v3.bin"), path("o.gguf")).find("version 3"), std::string::npos);

  write_bytes(path("short.bin"), {1, 2, 3});
  EXPECT_NE(convert_error(path("short.bin"), path("o.gguf")).find("header"), std::string::npos);
  EXPECT_NE(convert_error(path("missing.bin"), path("o.gguf")).find("cannot open"), std::string::npos);
}

TEST_F(Llama2cTest, ReadsSelfWrittenTokenizer) {
  std::vector<uint8_t> tok;
  append<int32_t>(tok, 8);
  const std::vector<std::pair<std::string, float>> pieces = {
      {"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}, {"<0x0A>", 0.0f}, {" the", -1.5f}, {"a b", -2.0f}};
  for (const auto& [piece, score] : pieces) {
    append<float>(tok, score);
    append<int32_t>(tok, static_cast<int32_t>(piece.size()));
    tok.insert(tok.end(), piece.begin(), piece.end());
  }
  write_bytes(path("tok.bin"), tok);
  const Llama2cVocab v = read_llama2c_tokenizer(path("tok.bin"), 6);
  EXPECT_EQ(v.tokens, (std::vector<std::string>{"<unk>", "<s>", "</s>", "<0x0A>", "\xe2\x96\x81the",
                                                "a\xe2\x96\x81" "b"}));
  EXPECT_EQ(v.token_types, (std::vector<int32_t>{2, 3, 3, 6, 1, 1}));
  EXPECT_EQ(v.scores[4], -1.5f);

  try {
    read_llama2c_tokenizer(path("tok.bin"), 10);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 6 of 10"), std::string::npos) << e.what();
  }
}

TEST_F(Llama2cTest, CommandLineConverts) {
  write_bytes(path("v1.bin"), build_checkpoint(kSmall, 1, true).bytes);
  const std::string cmd = std::string(KVSERVE_BINARY) + " convert llama2c " + path("v1.bin") + " " + path("v1.gguf") +
                          " --type q8_0 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  GGUFFile gguf(path("v1.gguf"));
  EXPECT_EQ(gguf.tensor("blk.0.attn_q.weight").type, DType::Q8_0);
  EXPECT_TRUE(gguf.get_bool("kvserve.placeholder_vocab", false));
  const std::string info = std::string(KVSERVE_BINARY) + " info " + path("v1.gguf") + " | grep -q 'placeholder'";
  EXPECT_EQ(std::system(info.c_str()), 0);
  const std::string bad = std::string(KVSERVE_BINARY) + " convert llama2c " + path("none.bin") + " " +
                          path("x.gguf") + " 2> /dev/null";
  EXPECT_NE(std::system(bad.c_str()), 0);
}
