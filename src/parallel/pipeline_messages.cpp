#include "parallel/pipeline_messages.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/dispatch.h"

namespace kvserve {
namespace {

constexpr int64_t kStepKind = 1, kShutdownKind = 2;
constexpr int64_t kReplyOk = 0, kReplyError = 1;

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>& out) : out_(out) { out_.clear(); }
  template <typename T>
  void put(const T& value) { put_array(std::span<const T>(&value, 1)); }
  template <typename T>
  void put_array(std::span<const T> values) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + values.size_bytes());
    if (!values.empty()) std::memcpy(out_.data() + at, values.data(), values.size_bytes());
  }

 private:
  std::vector<std::byte>& out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, const char* what) : bytes_(bytes), what_(what) {}
  template <typename T>
  T get() {
    T value;
    get_array(std::span<T>(&value, 1));
    return value;
  }
  template <typename T>
  void get_array(std::span<T> values) {
    if (values.size_bytes() > bytes_.size() - at_)
      throw Error(std::string("pipeline: a malformed ") + what_ + " message (" + std::to_string(bytes_.size()) +
                  " bytes): do all ranks run the same kvserve build?");
    if (!values.empty()) std::memcpy(values.data(), bytes_.data() + at_, values.size_bytes());
    at_ += values.size_bytes();
  }
  // A count read from the message, checked against what is left of it.
  size_t count(size_t item_bytes) {
    const auto n = get<int64_t>();
    if (n < 0 || static_cast<size_t>(n) > (bytes_.size() - at_) / item_bytes)
      throw Error(std::string("pipeline: a malformed ") + what_ + " message (count " + std::to_string(n) + ")");
    return static_cast<size_t>(n);
  }
  void expect_end() const {
    if (at_ != bytes_.size())
      throw Error(std::string("pipeline: a ") + what_ + " message has " + std::to_string(bytes_.size() - at_) +
                  " bytes too many");
  }
  std::span<const std::byte> rest() const { return bytes_.subspan(at_); }

 private:
  std::span<const std::byte> bytes_;
  const char* what_;
  size_t at_ = 0;
};

}  // namespace

std::vector<std::byte> PipelineSetup::encode() const {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.put(*this);
  return out;
}

PipelineSetup PipelineSetup::decode(std::span<const std::byte> bytes) {
  static_assert(std::is_trivially_copyable_v<PipelineSetup>);
  ByteReader r(bytes, "setup");
  const auto setup = r.get<PipelineSetup>();
  r.expect_end();
  const int64_t at_least_one[] = {setup.ranks, setup.total_layers, setup.dim, setup.vocab,
                                  setup.n_kv_heads, setup.head_dim, setup.n_blocks, setup.block_size};
  for (const int64_t v : at_least_one)
    if (v < 1) throw Error("pipeline: a malformed setup message (a size of " + std::to_string(v) + ")");
  if (setup.kv_type < 0 || setup.activations < 0)
    throw Error("pipeline: a malformed setup message (a negative kv type or activation precision)");
  return setup;
}

PipelineSetup pipeline_setup(const Model& stage, int ranks, const KVPoolShape& pool) {
  const ModelConfig& c = stage.config();
  PipelineSetup s;
  s.ranks = ranks;
  s.total_layers = stage.layer_range().total;
  s.dim = c.dim;
  s.vocab = c.vocab_size;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.n_blocks = pool.n_blocks;
  s.block_size = pool.block_size;
  s.kv_type = static_cast<int64_t>(pool.type);
  s.activations = static_cast<int64_t>(stage.activations().value_or(activation_precision()));
  return s;
}

std::string setup_differences(const PipelineSetup& a, const PipelineSetup& b) {
  std::string out;
  const auto field = [&](const char* name, int64_t x, int64_t y) {
    if (x != y) out += (out.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(x) + " vs " + std::to_string(y);
  };
  field("ranks", a.ranks, b.ranks);
  field("layers", a.total_layers, b.total_layers);
  field("dim", a.dim, b.dim);
  field("vocab", a.vocab, b.vocab);
  field("kv heads", a.n_kv_heads, b.n_kv_heads);
  field("head size", a.head_dim, b.head_dim);
  field("kv blocks", a.n_blocks, b.n_blocks);
  field("block size", a.block_size, b.block_size);
  field("kv type", a.kv_type, b.kv_type);
  field("activations", a.activations, b.activations);
  return out;
}

int64_t StepMessage::n_tokens() const {
  int64_t n = 0;
  for (const ChunkPlan& c : chunks) n += c.n_tokens;
  return n;
}

std::vector<SequenceChunk> StepMessage::sequence_chunks(std::vector<int32_t>& tokens) const {
  tokens.assign(static_cast<size_t>(n_tokens()), 0);
  std::vector<SequenceChunk> out;
  size_t at = 0;
  for (const ChunkPlan& c : chunks) {
    const auto n = static_cast<size_t>(c.n_tokens);
    out.push_back({std::span<const int32_t>(tokens).subspan(at, n), c.pos0, c.block_table, c.logits_rows > 0,
                   std::max<int64_t>(c.logits_rows, 1)});
    at += n;
  }
  return out;
}

void encode_step(std::span<const BlockCopy> copies, std::span<const SequenceChunk> chunks,
                 std::span<const float> activations, std::vector<std::byte>& out) {
  ByteWriter w(out);
  w.put(kStepKind);
  w.put(static_cast<int64_t>(copies.size()));
  for (const BlockCopy& c : copies) w.put_array(std::span<const BlockId>({c.src, c.dst}));
  w.put(static_cast<int64_t>(chunks.size()));
  for (const SequenceChunk& c : chunks) {
    const int64_t header[] = {static_cast<int64_t>(c.tokens.size()), c.pos0, c.want_logits ? c.logits_rows : 0,
                              static_cast<int64_t>(c.block_table.size())};
    w.put_array(std::span<const int64_t>(header));
    w.put_array(c.block_table);
  }
  w.put_array(activations);
}

std::vector<std::byte> encode_shutdown() {
  std::vector<std::byte> out;
  ByteWriter(out).put(kShutdownKind);
  return out;
}

namespace {

[[noreturn]] void malformed_step(const std::string& what) {
  throw Error("pipeline: a malformed step message: " + what + " (do all ranks run the same kvserve build and flags?)");
}

void check_block(BlockId id, const StepLimits& limits, const char* where) {
  if (id < 0 || id >= limits.n_blocks)
    malformed_step(std::string(where) + " names block " + std::to_string(id) + ", outside the pool of " +
                   std::to_string(limits.n_blocks) + " blocks");
}

// One chunk's plan; `tokens_left` is what the message's activations and the
// pool's slots can still hold, less this chunk's tokens on return.
ChunkPlan read_chunk(ByteReader& r, const StepLimits& limits, int64_t& tokens_left) {
  ChunkPlan c;
  c.n_tokens = r.get<int64_t>();
  c.pos0 = r.get<int64_t>();
  c.logits_rows = r.get<int64_t>();
  c.block_table.resize(r.count(sizeof(BlockId)));
  r.get_array(std::span<BlockId>(c.block_table));
  if (c.n_tokens < 1 || c.n_tokens > tokens_left)
    malformed_step("a chunk of " + std::to_string(c.n_tokens) + " tokens, with room for " +
                   std::to_string(tokens_left));
  tokens_left -= c.n_tokens;
  if (c.logits_rows < 0 || c.logits_rows > c.n_tokens)
    malformed_step(std::to_string(c.logits_rows) + " logits rows of a chunk of " + std::to_string(c.n_tokens) +
                   " tokens");
  int64_t end = 0, covered = 0;
  if (c.pos0 < 0 || __builtin_add_overflow(c.pos0, c.n_tokens, &end) ||
      __builtin_mul_overflow(static_cast<int64_t>(c.block_table.size()), limits.block_size, &covered) ||
      end > covered)
    malformed_step("a chunk at positions " + std::to_string(c.pos0) + " + " + std::to_string(c.n_tokens) +
                   " with a page table of " + std::to_string(c.block_table.size()) + " blocks");
  for (const BlockId id : c.block_table) check_block(id, limits, "a page table");
  return c;
}

}  // namespace

StepMessage decode_step(std::span<const std::byte> bytes, const StepLimits& limits) {
  if (limits.dim < 1 || limits.n_blocks < 1 || limits.block_size < 1)
    throw Error("pipeline: decode_step needs a positive width, pool and block size");
  ByteReader r(bytes, "step");
  StepMessage m;
  const auto kind = r.get<int64_t>();
  if (kind == kShutdownKind) {
    m.shutdown = true;
    r.expect_end();
    return m;
  }
  if (kind != kStepKind) throw Error("pipeline: a step message of unknown kind " + std::to_string(kind));
  m.copies.resize(r.count(2 * sizeof(BlockId)));
  for (BlockCopy& c : m.copies) {
    c.src = r.get<BlockId>();
    c.dst = r.get<BlockId>();
    check_block(c.src, limits, "a block copy");
    check_block(c.dst, limits, "a block copy");
  }
  m.chunks.resize(r.count(4 * sizeof(int64_t)));
  // Every token needs dim floats of activations here and a KV slot of the pool.
  int64_t token_bytes = 0, slots = 0;
  if (__builtin_mul_overflow(limits.dim, static_cast<int64_t>(sizeof(float)), &token_bytes) ||
      __builtin_mul_overflow(limits.n_blocks, limits.block_size, &slots))
    throw Error("pipeline: a stage's width or pool is too large to address");
  int64_t tokens_left = std::min(static_cast<int64_t>(bytes.size()) / token_bytes, slots);
  for (ChunkPlan& c : m.chunks) c = read_chunk(r, limits, tokens_left);
  const auto floats = static_cast<size_t>(m.n_tokens() * limits.dim);  // bounded by the message's bytes above
  if (r.rest().size() != floats * sizeof(float))
    throw Error("pipeline: a step message carries " + std::to_string(r.rest().size()) + " bytes of activations, expected " +
                std::to_string(floats * sizeof(float)) + " (do all ranks run the same model?)");
  m.activations.resize(floats);
  r.get_array(std::span<float>(m.activations));
  return m;
}

void encode_logits_reply(std::span<const float> logits, std::vector<std::byte>& out) {
  ByteWriter w(out);
  w.put(kReplyOk);
  w.put_array(logits);
}

std::vector<std::byte> encode_error_reply(const std::string& message) {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.put(kReplyError);
  w.put_array(std::span<const char>(message.data(), message.size()));
  return out;
}

void decode_reply(std::span<const std::byte> bytes, int sender, std::span<float> logits) {
  ByteReader r(bytes, "reply");
  const auto status = r.get<int64_t>();
  if (status == kReplyError) {
    const std::span<const std::byte> text = r.rest();
    throw Error("pipeline rank " + std::to_string(sender) + ": " +
                std::string(reinterpret_cast<const char*>(text.data()), text.size()));
  }
  if (status != kReplyOk) throw Error("pipeline: a reply of unknown status " + std::to_string(status));
  if (r.rest().size() != logits.size_bytes())
    throw Error("pipeline rank " + std::to_string(sender) + " sent " + std::to_string(r.rest().size()) +
                " bytes of logits, expected " + std::to_string(logits.size_bytes()));
  r.get_array(logits);
}

}  // namespace kvserve
