#include "model/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "model/gguf.h"

namespace kvserve {
namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// One scalar of type t, from the integer / float views GGUFFile fills.
void put_scalar(std::vector<uint8_t>& out, GGUFType t, int64_t i, uint64_t u, double f) {
  switch (t) {
    case GGUFType::U8: put<uint8_t>(out, static_cast<uint8_t>(u)); break;
    case GGUFType::I8: put<int8_t>(out, static_cast<int8_t>(i)); break;
    case GGUFType::U16: put<uint16_t>(out, static_cast<uint16_t>(u)); break;
    case GGUFType::I16: put<int16_t>(out, static_cast<int16_t>(i)); break;
    case GGUFType::U32: put<uint32_t>(out, static_cast<uint32_t>(u)); break;
    case GGUFType::I32: put<int32_t>(out, static_cast<int32_t>(i)); break;
    case GGUFType::U64: put<uint64_t>(out, u); break;
    case GGUFType::I64: put<int64_t>(out, i); break;
    case GGUFType::F32: put<float>(out, static_cast<float>(f)); break;
    case GGUFType::F64: put<double>(out, f); break;
    case GGUFType::BOOL: put<uint8_t>(out, u != 0 ? 1 : 0); break;
    case GGUFType::STRING: case GGUFType::ARRAY: check(false, "put_scalar takes numbers only"); break;
  }
}

}  // namespace

void GGUFWriter::set_value(const std::string& key, const GGUFValue& v) {
  begin_kv(key, static_cast<uint32_t>(v.type));
  if (v.type == GGUFType::STRING) return put_string(kv_bytes_, v.str);
  if (v.type != GGUFType::ARRAY) return put_scalar(kv_bytes_, v.type, v.i, v.u, v.f);
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(v.elem_type));
  put<uint64_t>(kv_bytes_, v.array_size());
  if (v.elem_type == GGUFType::STRING) {
    for (size_t i = 0; i < v.strings.size(); ++i) put_string(kv_bytes_, v.strings[i]);
    return;
  }
  // Array numbers are kept as doubles: exact for every 32-bit type and for
  // 64-bit integers below 2^53.
  for (double x : v.numbers)
    put_scalar(kv_bytes_, v.elem_type, static_cast<int64_t>(x), static_cast<uint64_t>(static_cast<int64_t>(x)), x);
}

void GGUFWriter::begin_kv(const std::string& key, uint32_t type) {
  put_string(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, type);
  ++n_kv_;
}

void GGUFWriter::set_u32(const std::string& key, uint32_t v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::U32));
  put(kv_bytes_, v);
}
void GGUFWriter::set_i32(const std::string& key, int32_t v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::I32));
  put(kv_bytes_, v);
}
void GGUFWriter::set_u64(const std::string& key, uint64_t v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::U64));
  put(kv_bytes_, v);
}
void GGUFWriter::set_f32(const std::string& key, float v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::F32));
  put(kv_bytes_, v);
}
void GGUFWriter::set_bool(const std::string& key, bool v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::BOOL));
  put<uint8_t>(kv_bytes_, v ? 1 : 0);
}
void GGUFWriter::set_string(const std::string& key, const std::string& v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::STRING));
  put_string(kv_bytes_, v);
}
void GGUFWriter::set_string_array(const std::string& key, const std::vector<std::string>& v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::ARRAY));
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GGUFType::STRING));
  put<uint64_t>(kv_bytes_, v.size());
  for (const auto& s : v) put_string(kv_bytes_, s);
}
void GGUFWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::ARRAY));
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GGUFType::F32));
  put<uint64_t>(kv_bytes_, v.size());
  for (float x : v) put(kv_bytes_, x);
}
void GGUFWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  begin_kv(key, static_cast<uint32_t>(GGUFType::ARRAY));
  put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GGUFType::I32));
  put<uint64_t>(kv_bytes_, v.size());
  for (int32_t x : v) put(kv_bytes_, x);
}

void GGUFWriter::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, const void* bytes,
                            size_t nbytes) {
  if (ne.empty() || ne.size() > 4) throw Error("tensor " + name + ": 1 to 4 dimensions expected");
  int64_t numel = 1;
  for (int64_t d : ne) numel *= d;
  const DTypeInfo& info = dtype_info(type);
  if (ne[0] % info.block_size != 0)
    throw Error("tensor " + name + ": row length " + std::to_string(ne[0]) + " is not a multiple of the " +
                info.name + " block size");
  const size_t expected = static_cast<size_t>(numel / info.block_size * info.block_bytes);
  if (nbytes != expected)
    throw Error("tensor " + name + ": got " + std::to_string(nbytes) + " bytes, expected " + std::to_string(expected));
  Tensor t{name, type, ne, {}};
  t.bytes.assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + nbytes);
  tensors_.push_back(std::move(t));
}

void GGUFWriter::add_f32_tensor(const std::string& name, const std::vector<int64_t>& ne,
                                const std::vector<float>& values) {
  add_tensor(name, DType::F32, ne, values.data(), values.size() * sizeof(float));
}

std::vector<uint8_t> GGUFWriter::serialize() const {
  std::vector<uint8_t> out;
  put<uint32_t>(out, 0x46554747);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, n_kv_);
  out.insert(out.end(), kv_bytes_.begin(), kv_bytes_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset += (t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, 0);
  }
  return out;
}

void GGUFWriter::write(const std::string& path) const {
  const std::vector<uint8_t> bytes = serialize();
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) throw Error(path + ": cannot open for writing: " + std::strerror(errno));
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    throw Error(path + ": write failed: " + std::strerror(errno));
}

}  // namespace kvserve
