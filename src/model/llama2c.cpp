#include "model/llama2c.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "kernels/quantize.h"
#include "model/gguf_writer.h"
#include "model/gguf_token_type.h"

namespace kvserve {
namespace {

constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42"
constexpr size_t kVersionedHeaderBytes = 256;
constexpr float kLlama2cRopeTheta = 10000.0f;
constexpr float kLlama2cRmsEps = 1e-5f;

// Sequential reads from a file whose size is known up front, so that every
// read can say what it was reading when the file ends too early.
class BoundedReader {
 public:
  explicit BoundedReader(const std::string& path) : path_(path), file_(std::fopen(path.c_str(), "rb"), &std::fclose) {
    if (!file_) throw Error(path + ": cannot open: " + std::strerror(errno));
    std::error_code ec;
    size_ = std::filesystem::file_size(path, ec);
    if (ec) throw Error(path + ": cannot stat: " + ec.message());
  }

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  size_t offset() const { return offset_; }

  // `what` names the field or tensor for the truncation message.
  void read(void* dst, size_t nbytes, const std::string& what) {
    require(nbytes, what);
    if (nbytes > 0 && std::fread(dst, 1, nbytes, file_.get()) != nbytes)
      throw Error(path_ + ": read failed at offset " + std::to_string(offset_) + " (" + what + ")");
    offset_ += nbytes;
  }
  void skip(size_t nbytes, const std::string& what) {
    require(nbytes, what);
    if (std::fseek(file_.get(), static_cast<long>(offset_ + nbytes), SEEK_SET) != 0)
      throw Error(path_ + ": seek failed (" + what + ")");
    offset_ += nbytes;
  }
  template <typename T>
  T read_value(const std::string& what) {
    T v{};
    read(&v, sizeof(T), what);
    return v;
  }
  // Throws the truncation error unless nbytes remain: lets callers check a
  // tensor before allocating room for it.
  void require(size_t nbytes, const std::string& what) const {
    if (nbytes > size_ - offset_)
      throw Error(path_ + ": truncated: " + what + " needs " + std::to_string(nbytes) + " bytes at offset " +
                  std::to_string(offset_) + " but the file is " + std::to_string(size_) + " bytes");
  }

 private:
  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
  size_t size_ = 0;
  size_t offset_ = 0;
};

void require_field(bool ok, const std::string& path, const char* field, int64_t value, const char* rule) {
  if (!ok)
    throw Error(path + ": invalid llama2.c header: " + field + " = " + std::to_string(value) + " (" + rule + ")");
}

void validate_config(const Llama2cConfig& c, const std::string& path) {
  // Upper bounds keep every size product far from overflow.
  require_field(c.dim > 0 && c.dim <= (1 << 16), path, "dim", c.dim, "expected 1..65536");
  require_field(c.hidden_dim > 0 && c.hidden_dim <= (1 << 20), path, "hidden_dim", c.hidden_dim, "expected 1..2^20");
  require_field(c.n_layers > 0 && c.n_layers <= 1024, path, "n_layers", c.n_layers, "expected 1..1024");
  require_field(c.n_heads > 0 && c.dim % c.n_heads == 0, path, "n_heads", c.n_heads, "must divide dim");
  require_field(c.head_dim() % 2 == 0, path, "n_heads", c.n_heads, "head size dim/n_heads must be even for RoPE");
  require_field(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, path, "n_kv_heads", c.n_kv_heads,
                "must divide n_heads");
  require_field(c.vocab_size > 0 && c.vocab_size <= (1 << 22), path, "vocab_size", c.vocab_size, "expected 1..2^22");
  require_field(c.seq_len > 0 && c.seq_len <= (1 << 24), path, "seq_len", c.seq_len, "expected 1..2^24");
  if (c.version == 2) {
    require_field(c.group_size > 0 && c.dim % c.group_size == 0, path, "group_size", c.group_size,
                  "must be positive and divide dim");
  }
}

Llama2cConfig parse_header(BoundedReader& in) {
  Llama2cConfig c;
  const uint32_t first = in.read_value<uint32_t>("header magic");
  int32_t fields[7];
  if (first == kLlama2cMagic) {
    c.version = in.read_value<int32_t>("header version");
    if (c.version != 1 && c.version != 2)
      throw Error(in.path() + ": llama2.c checkpoint version " + std::to_string(c.version) +
                  " is not supported (versions 0, 1 and 2 are)");
    in.read(fields, sizeof(fields), "header fields");
    c.shared_classifier = in.read_value<uint8_t>("header shared_classifier") != 0;
    if (c.version == 2) c.group_size = in.read_value<int32_t>("header group_size");
    in.skip(kVersionedHeaderBytes - in.offset(), "header padding");
  } else {
    // Legacy files have no magic: the first word is dim.
    std::memcpy(&fields[0], &first, sizeof(first));
    in.read(fields + 1, sizeof(fields) - sizeof(first), "header fields");
  }
  c.dim = fields[0];
  c.hidden_dim = fields[1];
  c.n_layers = fields[2];
  c.n_heads = fields[3];
  c.n_kv_heads = fields[4];
  c.vocab_size = fields[5];
  c.seq_len = fields[6];
  if (c.version == 0) {
    // Negative means a separate classifier; a value too large either way
    // stays out of range for validate_config to report.
    c.shared_classifier = c.vocab_size > 0;
    if (c.vocab_size < 0 && c.vocab_size >= -(1 << 22)) c.vocab_size = -c.vocab_size;
  }
  c.header_bytes = in.offset();
  validate_config(c, in.path());
  return c;
}

// One tensor as it sits in the checkpoint, and where it goes in the GGUF.
struct PlannedTensor {
  std::string source_name;  // llama2.c's name, for messages
  int layer = -1;
  std::string gguf_name;
  int64_t rows = 1;  // 1 for vectors (norms)
  int64_t cols = 0;
  bool grouped_q8 = false;  // version 2 int8 + scales
  int order = 0;            // position in the GGUF file

  std::string describe(int n_layers) const {
    std::string s = "tensor " + source_name;
    if (layer >= 0) s += " (layer " + std::to_string(layer) + " of " + std::to_string(n_layers) + ")";
    return s;
  }
};

// GGUF order: embeddings, then each block's tensors, then the output head.
constexpr int kOrderEmbedding = 0;
constexpr int kOrderOutputNorm = 1 << 30;
constexpr int kOrderOutput = kOrderOutputNorm + 1;
int block_order(int layer, int slot) { return 1 + layer * 16 + slot; }

class TensorPlan {
 public:
  explicit TensorPlan(const Llama2cConfig& c) : c_(c) {}

  void global(const char* source, const char* gguf, int64_t rows, int64_t cols, bool q8, int order) {
    tensors_.push_back({source, -1, gguf, rows, cols, q8, order});
  }
  void per_layer(const char* source, const char* suffix, int64_t rows, int64_t cols, bool q8, int slot) {
    for (int l = 0; l < c_.n_layers; ++l)
      tensors_.push_back({source, l, "blk." + std::to_string(l) + "." + suffix, rows, cols, q8, block_order(l, slot)});
  }
  void norms(bool attn, bool ffn) {
    if (attn) per_layer("rms_att", "attn_norm.weight", 1, c_.dim, false, 0);
    if (ffn) per_layer("rms_ffn", "ffn_norm.weight", 1, c_.dim, false, 5);
  }
  void attention(bool q8) {
    per_layer("wq", "attn_q.weight", c_.dim, c_.dim, q8, 1);
    per_layer("wk", "attn_k.weight", c_.kv_dim(), c_.dim, q8, 2);
    per_layer("wv", "attn_v.weight", c_.kv_dim(), c_.dim, q8, 3);
    per_layer("wo", "attn_output.weight", c_.dim, c_.dim, q8, 4);
  }
  void ffn(bool q8) {
    per_layer("w1", "ffn_gate.weight", c_.hidden_dim, c_.dim, q8, 6);
    per_layer("w2", "ffn_down.weight", c_.dim, c_.hidden_dim, q8, 8);
    per_layer("w3", "ffn_up.weight", c_.hidden_dim, c_.dim, q8, 7);
  }
  void embedding(bool q8) { global("token_embedding", "token_embd.weight", c_.vocab_size, c_.dim, q8, kOrderEmbedding); }
  void final_norm() { global("rms_final", "output_norm.weight", 1, c_.dim, false, kOrderOutputNorm); }
  void classifier(bool q8) {
    if (!c_.shared_classifier) global("wcls", "output.weight", c_.vocab_size, c_.dim, q8, kOrderOutput);
  }

  std::vector<PlannedTensor>& tensors() { return tensors_; }

 private:
  const Llama2cConfig& c_;
  std::vector<PlannedTensor> tensors_;
};

// The tensors before the (legacy-only) RoPE tables, in file order.
std::vector<PlannedTensor> plan_tensors(const Llama2cConfig& c) {
  TensorPlan plan(c);
  const bool q8 = c.version == 2;
  if (c.version == 0) {
    plan.embedding(false);
    plan.norms(true, false);
    plan.attention(false);
    plan.norms(false, true);
    plan.ffn(false);
    plan.final_norm();
  } else {
    plan.norms(true, false);
    plan.norms(false, true);
    plan.final_norm();
    plan.embedding(q8);
    plan.attention(q8);
    plan.ffn(q8);
    plan.classifier(q8);
  }
  return std::move(plan.tensors());
}

std::vector<float> read_planned(BoundedReader& in, const PlannedTensor& t, const Llama2cConfig& c) {
  const size_t numel = static_cast<size_t>(t.rows * t.cols);
  const std::string what = t.describe(c.n_layers);
  in.require(t.grouped_q8 ? numel + numel / c.group_size * sizeof(float) : numel * sizeof(float), what);
  std::vector<float> values(numel);
  if (!t.grouped_q8) {
    in.read(values.data(), numel * sizeof(float), what);
    return values;
  }
  if (numel % static_cast<size_t>(c.group_size) != 0)
    throw Error(in.path() + ": " + what + " has " + std::to_string(numel) + " values, not a multiple of group_size " +
                std::to_string(c.group_size));
  std::vector<int8_t> quants(numel);
  std::vector<float> scales(numel / c.group_size);
  in.read(quants.data(), quants.size(), what + " int8 values");
  in.read(scales.data(), scales.size() * sizeof(float), what + " scales");
  for (size_t i = 0; i < numel; ++i) values[i] = static_cast<float>(quants[i]) * scales[i / c.group_size];
  return values;
}

struct EncodedTensor {
  int order = 0;
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
};

EncodedTensor encode(const PlannedTensor& t, const std::vector<float>& values, DType wanted, Llama2cReport& report) {
  EncodedTensor out{t.order, t.gguf_name, DType::F32, {}, {}};
  out.ne = t.rows == 1 ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.cols, t.rows};
  if (t.rows > 1) {
    out.type = wanted;
    if (t.cols % dtype_info(wanted).block_size != 0) {
      out.type = DType::F32;
      if (wanted != DType::F32) report.kept_f32.push_back(t.gguf_name);
    }
  }
  const size_t row_bytes = dtype_row_bytes(out.type, t.cols);
  out.bytes.resize(row_bytes * static_cast<size_t>(t.rows));
  for (int64_t r = 0; r < t.rows; ++r)
    quantize_row(out.type, values.data() + r * t.cols, out.bytes.data() + r * row_bytes, t.cols);
  return out;
}

std::vector<EncodedTensor> read_all_tensors(BoundedReader& in, const Llama2cConfig& c, DType type,
                                            Llama2cReport& report) {
  std::vector<EncodedTensor> encoded;
  for (const PlannedTensor& t : plan_tensors(c)) encoded.push_back(encode(t, read_planned(in, t, c), type, report));
  if (c.version == 0 && !c.shared_classifier) {
    // Legacy files store RoPE cos/sin tables before the classifier; the
    // engine computes its own.
    const size_t table_bytes = static_cast<size_t>(c.seq_len) * (c.head_dim() / 2) * sizeof(float);
    in.skip(table_bytes, "freq_cis_real");
    in.skip(table_bytes, "freq_cis_imag");
    TensorPlan plan(c);
    plan.classifier(false);
    const PlannedTensor& t = plan.tensors().front();
    encoded.push_back(encode(t, read_planned(in, t, c), type, report));
  }
  std::stable_sort(encoded.begin(), encoded.end(),
                   [](const EncodedTensor& a, const EncodedTensor& b) { return a.order < b.order; });
  return encoded;
}

void write_model_metadata(GGUFWriter& w, const Llama2cConfig& c, const std::string& name) {
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", name);
  w.set_u32("llama.context_length", static_cast<uint32_t>(c.seq_len));
  w.set_u32("llama.embedding_length", static_cast<uint32_t>(c.dim));
  w.set_u32("llama.block_count", static_cast<uint32_t>(c.n_layers));
  w.set_u32("llama.feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
  w.set_u32("llama.attention.head_count", static_cast<uint32_t>(c.n_heads));
  w.set_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w.set_f32("llama.rope.freq_base", kLlama2cRopeTheta);
  w.set_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim()));
  w.set_f32("llama.attention.layer_norm_rms_epsilon", kLlama2cRmsEps);
  w.set_u32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
}

void write_vocab_metadata(GGUFWriter& w, const Llama2cVocab& vocab, bool placeholder) {
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", true);
  if (placeholder) w.set_bool("kvserve.placeholder_vocab", true);
}

bool is_byte_piece(const std::string& piece) {
  return piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(piece[3])) && std::isxdigit(static_cast<unsigned char>(piece[4]));
}

// llama2.c's exporter replaced every U+2581 with a space; undo that.
std::string restore_space_marks(const std::string& piece) {
  std::string out;
  out.reserve(piece.size() + 4);
  for (char ch : piece) {
    if (ch == ' ')
      out += "\xe2\x96\x81";
    else
      out += ch;
  }
  return out;
}


void add_special_tokens(Llama2cVocab& v) {
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.scores = {0.0f, 0.0f, 0.0f};
  v.token_types = {gguf_token_type::kUnknown, gguf_token_type::kControl, gguf_token_type::kControl};
}

}  // namespace

Llama2cConfig read_llama2c_config(const std::string& path) {
  BoundedReader in(path);
  return parse_header(in);
}

Llama2cVocab read_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  BoundedReader in(path);
  const auto max_token_length = in.read_value<int32_t>("max_token_length");
  if (max_token_length <= 0 || max_token_length > (1 << 16))
    throw Error(path + ": invalid tokenizer max_token_length " + std::to_string(max_token_length));
  Llama2cVocab v;
  add_special_tokens(v);
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string what = "token " + std::to_string(id) + " of " + std::to_string(vocab_size);
    const auto score = in.read_value<float>(what + " score");
    const auto length = in.read_value<int32_t>(what + " length");
    if (length < 0 || length > (1 << 16))
      throw Error(path + ": " + what + " has invalid length " + std::to_string(length));
    std::string piece(static_cast<size_t>(length), '\0');
    in.read(piece.data(), piece.size(), what + " bytes");
    if (id < 3) {
      v.scores[id] = score;  // the names of ids 0..2 are fixed by llama2.c
      continue;
    }
    const bool byte = is_byte_piece(piece);
    v.tokens.push_back(byte ? piece : restore_space_marks(piece));
    v.scores.push_back(score);
    v.token_types.push_back(byte ? gguf_token_type::kByte : gguf_token_type::kNormal);
  }
  v.tokens.resize(static_cast<size_t>(vocab_size));  // vocab_size < 3 only
  v.scores.resize(v.tokens.size());
  v.token_types.resize(v.tokens.size());
  return v;
}

Llama2cVocab make_placeholder_vocab(int32_t vocab_size) {
  Llama2cVocab v;
  add_special_tokens(v);
  char piece[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    v.tokens.push_back(piece);
    v.scores.push_back(0.0f);
    v.token_types.push_back(gguf_token_type::kByte);
  }
  for (int32_t id = static_cast<int32_t>(v.tokens.size()); id < vocab_size; ++id) {
    v.tokens.push_back("<unused_" + std::to_string(id) + ">");
    v.scores.push_back(0.0f);
    v.token_types.push_back(gguf_token_type::kNormal);
  }
  // A vocabulary smaller than the byte set keeps its first vocab_size entries.
  v.tokens.resize(static_cast<size_t>(vocab_size));
  v.scores.resize(v.tokens.size());
  v.token_types.resize(v.tokens.size());
  return v;
}

Llama2cReport convert_llama2c(const Llama2cOptions& options) {
  const DTypeInfo& type_info = dtype_info(options.type);
  if (options.type != DType::F32 && options.type != DType::F16 && options.type != DType::BF16 &&
      options.type != DType::Q8_0 && options.type != DType::Q4_0 && options.type != DType::Q4_1)
    throw Error(std::string("convert: output type ") + type_info.name + " is not supported");
  BoundedReader in(options.checkpoint_path);
  Llama2cReport report;
  report.config = parse_header(in);
  const Llama2cConfig& c = report.config;

  GGUFWriter writer;
  const std::string name = options.model_name.empty()
                               ? std::filesystem::path(options.checkpoint_path).stem().string()
                               : options.model_name;
  write_model_metadata(writer, c, name);
  report.placeholder_vocab = options.tokenizer_path.empty();
  const Llama2cVocab vocab = report.placeholder_vocab ? make_placeholder_vocab(c.vocab_size)
                                                      : read_llama2c_tokenizer(options.tokenizer_path, c.vocab_size);
  write_vocab_metadata(writer, vocab, report.placeholder_vocab);

  for (const EncodedTensor& t : read_all_tensors(in, c, options.type, report)) {
    writer.add_tensor(t.name, t.type, t.ne, t.bytes.data(), t.bytes.size());
    ++report.tensor_count;
  }
  writer.write(options.output_path);
  return report;
}

}  // namespace kvserve
