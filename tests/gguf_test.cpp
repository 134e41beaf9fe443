// GGUF reader/writer: round trips of every metadata type, and corrupt files
// that must each give a clear error instead of a crash.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::TempFile;

namespace {

GGUFWriter small_file() {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 3);
  w.set_i32("some.i32", -7);
  w.set_u64("some.u64", 1ull << 40);
  w.set_f32("some.f32", 0.5f);
  w.set_bool("some.bool", true);
  w.set_string_array("some.strings", {"a", "", "日本"});
  w.set_f32_array("some.floats", {1.5f, -2.0f});
  w.set_i32_array("some.ints", {3, -4, 5});
  std::vector<float> t(4 * 3);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i) * 0.25f;
  w.add_f32_tensor("weights", {4, 3}, t);
  w.add_f32_tensor("bias", {3}, {1, 2, 3});
  return w;
}

// Expects loading `bytes` to throw an Error whose message contains `needle`.
void expect_load_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  TempFile f(".gguf");
  f.write(bytes);
  try {
    GGUFFile g(f.path());
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(f.path()), std::string::npos) << "error should name the file: " << msg;
  }
}

void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

}  // namespace

TEST(GGUF, RoundTripsEveryMetadataTypeAndTensors) {
  TempFile f(".gguf");
  small_file().write(f.path());
  GGUFFile g(f.path());
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_uint("llama.block_count"), 3u);
  EXPECT_EQ(g.find("some.i32")->i, -7);
  EXPECT_EQ(g.get_uint("some.u64"), 1ull << 40);
  EXPECT_FLOAT_EQ(static_cast<float>(g.get_float("some.f32")), 0.5f);
  EXPECT_TRUE(g.get_bool("some.bool", false));
  EXPECT_EQ(g.get_string_array("some.strings").to_vector(), (std::vector<std::string>{"a", "", "日本"}));
  EXPECT_EQ(g.get_number_array("some.floats"), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(g.get_number_array("some.ints"), (std::vector<double>{3, -4, 5}));
  ASSERT_EQ(g.tensors().size(), 2u);
  const TensorView& t = g.tensor("weights");
  EXPECT_EQ(t.cols(), 4);
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % GGUFWriter::kAlignment, 0u);
  const auto* v = reinterpret_cast<const float*>(t.data);
  EXPECT_FLOAT_EQ(v[5], 1.25f);
  EXPECT_FLOAT_EQ(reinterpret_cast<const float*>(g.tensor("bias").data)[2], 3.0f);
  EXPECT_EQ(g.get_uint("missing", 9), 9u);
}

TEST(GGUF, TypedGettersNameTheKey) {
  TempFile f(".gguf");
  small_file().write(f.path());
  GGUFFile g(f.path());
  EXPECT_THROW(g.get_uint("nope"), Error);
  try {
    g.get_uint("general.architecture");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture has type string"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.tensor("absent"), Error);
}

TEST(GGUF, MissingFileIsAnError) {
  try {
    GGUFFile g("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf: cannot open"), std::string::npos) << e.what();
  }
}

TEST(GGUF, BadMagic) {
  auto b = small_file().serialize();
  b[0] = 'X';
  expect_load_error(b, "bad magic");
}

TEST(GGUF, UnsupportedVersion) {
  auto b = small_file().serialize();
  b[4] = 9;
  expect_load_error(b, "unsupported GGUF version 9");
}

TEST(GGUF, EveryTruncationGivesAnError) {
  const auto full = small_file().serialize();
  // The last tensor (12 bytes) is followed by 20 bytes of alignment padding,
  // which a reader may do without. Any shorter cut must throw, never crash.
  const size_t needed = full.size() - 20;
  for (size_t len = 0; len < needed; ++len) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
    TempFile f(".gguf");
    f.write(cut);
    EXPECT_THROW(GGUFFile g(f.path()), Error) << "length " << len;
  }
}

TEST(GGUF, TruncatedHeaderNamesFieldAndOffset) {
  auto b = small_file().serialize();
  b.resize(12);
  expect_load_error(b, "unexpected end of file while reading tensor_count at offset 8");
}

TEST(GGUF, AbsurdTensorCount) {
  auto b = small_file().serialize();
  put_u64(b, 8, 1ull << 60);
  expect_load_error(b, "tensor count");
}

TEST(GGUF, AbsurdMetadataCount) {
  auto b = small_file().serialize();
  put_u64(b, 16, 1ull << 60);
  expect_load_error(b, "metadata count");
}

TEST(GGUF, AbsurdStringLength) {
  auto b = small_file().serialize();
  put_u64(b, 24, 1ull << 50);  // length of the first key
  expect_load_error(b, "string length");
}

TEST(GGUF, TensorPastEndOfFile) {
  GGUFWriter w = small_file();
  auto b = w.serialize();
  b.resize(b.size() - 40);  // drop the tail of the tensor data
  expect_load_error(b, "lies past the end of the file");
}

TEST(GGUF, UnknownTensorType) {
  GGUFWriter w;
  w.add_f32_tensor("x", {2}, {1, 2});
  auto b = w.serialize();
  // header(24) + name(8+1) + n_dims(4) + dim(8) = type at 45
  const uint32_t bogus = 77;
  std::memcpy(b.data() + 45, &bogus, 4);
  expect_load_error(b, "unknown tensor type id 77");
}

TEST(GGUF, TooManyDimensions) {
  GGUFWriter w;
  w.add_f32_tensor("x", {2}, {1, 2});
  auto b = w.serialize();
  const uint32_t dims = 9;
  std::memcpy(b.data() + 33, &dims, 4);
  expect_load_error(b, "n_dims 9");
}

TEST(GGUF, ReadsVersion2) {
  auto b = small_file().serialize();
  b[4] = 2;
  TempFile f(".gguf");
  f.write(b);
  GGUFFile g(f.path());
  EXPECT_EQ(g.version(), 2u);
}
