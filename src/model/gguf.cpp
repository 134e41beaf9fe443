#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace kvserve {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxDims = 4;

// Sequential, bounds-checked reader over the mapped bytes.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, size_t size) : path_(path), base_(base), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& field, const std::string& what, size_t at) const {
    throw Error(path_ + ": " + what + " while reading " + field + " at offset " + std::to_string(at) +
                " (file is " + std::to_string(size_) + " bytes)");
  }

  void need(size_t n, const std::string& field) const {
    if (n > remaining()) fail(field, "unexpected end of file", pos_);
  }

  template <typename T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& field) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(field + " (string length)");
    if (len > remaining()) fail(field, "string length " + std::to_string(len) + " runs past the end of file", at);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  void align_to(size_t alignment) { pos_ = (pos_ + alignment - 1) / alignment * alignment; }

 private:
  const std::string& path_;
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

size_t scalar_size(GGUFType t) {
  switch (t) {
    case GGUFType::U8: case GGUFType::I8: case GGUFType::BOOL: return 1;
    case GGUFType::U16: case GGUFType::I16: return 2;
    case GGUFType::U32: case GGUFType::I32: case GGUFType::F32: return 4;
    case GGUFType::U64: case GGUFType::I64: case GGUFType::F64: return 8;
    case GGUFType::STRING: return 8;  // at least the length prefix
    case GGUFType::ARRAY: return 12;  // at least type + count
  }
  return 0;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::F64); }

// Reads one scalar of type t into v (numbers into i/u/f/b; strings into str).
void read_scalar(Cursor& c, GGUFType t, GGUFValue& v, const std::string& field) {
  switch (t) {
    case GGUFType::U8: v.u = c.read<uint8_t>(field); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I8: v.i = c.read<int8_t>(field); v.u = static_cast<uint64_t>(v.i); break;
    case GGUFType::U16: v.u = c.read<uint16_t>(field); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I16: v.i = c.read<int16_t>(field); v.u = static_cast<uint64_t>(v.i); break;
    case GGUFType::U32: v.u = c.read<uint32_t>(field); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I32: v.i = c.read<int32_t>(field); v.u = static_cast<uint64_t>(v.i); break;
    case GGUFType::U64: v.u = c.read<uint64_t>(field); v.i = static_cast<int64_t>(v.u); break;
    case GGUFType::I64: v.i = c.read<int64_t>(field); v.u = static_cast<uint64_t>(v.i); break;
    case GGUFType::F32: v.f = c.read<float>(field); break;
    case GGUFType::F64: v.f = c.read<double>(field); break;
    case GGUFType::BOOL: v.b = c.read<uint8_t>(field) != 0; v.u = v.b; v.i = v.b; break;
    case GGUFType::STRING: v.str = c.read_string(field); break;
    case GGUFType::ARRAY: break;  // handled by the caller
  }
  if (t != GGUFType::F32 && t != GGUFType::F64 && t != GGUFType::STRING) v.f = static_cast<double>(v.i);
  if (t == GGUFType::U64) v.f = static_cast<double>(v.u);
}

GGUFValue read_value(Cursor& c, const std::string& key) {
  GGUFValue v;
  const size_t at = c.pos();
  const uint32_t type = c.read<uint32_t>(key + " (value type)");
  if (!valid_type(type)) c.fail(key, "invalid value type " + std::to_string(type), at);
  v.type = static_cast<GGUFType>(type);
  if (v.type != GGUFType::ARRAY) {
    read_scalar(c, v.type, v, key);
    return v;
  }
  const size_t elem_at = c.pos();
  const uint32_t elem = c.read<uint32_t>(key + " (array element type)");
  if (!valid_type(elem) || elem == static_cast<uint32_t>(GGUFType::ARRAY))
    c.fail(key, "invalid array element type " + std::to_string(elem), elem_at);
  v.elem_type = static_cast<GGUFType>(elem);
  const size_t count_at = c.pos();
  const uint64_t count = c.read<uint64_t>(key + " (array length)");
  if (count > c.remaining() / scalar_size(v.elem_type))
    c.fail(key, "array length " + std::to_string(count) + " exceeds what the file can hold", count_at);
  if (v.elem_type == GGUFType::STRING) {
    v.strings.reserve(count);
    for (uint64_t k = 0; k < count; ++k) v.strings.push_back(c.read_string(key + "[" + std::to_string(k) + "]"));
  } else {
    v.numbers.reserve(count);
    GGUFValue e;
    for (uint64_t k = 0; k < count; ++k) {
      read_scalar(c, v.elem_type, e, key);
      v.numbers.push_back(e.f);
    }
  }
  return v;
}

}  // namespace

const char* gguf_type_name(GGUFType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "invalid";
}

bool GGUFValue::is_integer() const {
  switch (type) {
    case GGUFType::U8: case GGUFType::I8: case GGUFType::U16: case GGUFType::I16:
    case GGUFType::U32: case GGUFType::I32: case GGUFType::U64: case GGUFType::I64: case GGUFType::BOOL:
      return true;
    default:
      return false;
  }
}

GGUFFile::GGUFFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd_);
    throw Error(path + ": file is empty (expected a GGUF model)");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (p == MAP_FAILED) {
    ::close(fd_);
    throw Error(path + ": mmap failed: " + std::strerror(errno));
  }
  base_ = static_cast<const uint8_t*>(p);
  try {
    parse();
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    ::close(fd_);
    throw;
  }
}

GGUFFile::~GGUFFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void GGUFFile::parse() {
  Cursor c(path_, base_, size_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) c.fail("magic", "bad magic (not a GGUF file)", 0);
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    c.fail("version", "unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)", 4);
  size_t at = c.pos();
  const uint64_t n_tensors = c.read<uint64_t>("tensor_count");
  // A tensor info takes at least 8 (name) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes.
  if (n_tensors > c.remaining() / 32)
    c.fail("tensor_count", "tensor count " + std::to_string(n_tensors) + " exceeds what the file can hold", at);
  at = c.pos();
  const uint64_t n_kv = c.read<uint64_t>("metadata_kv_count");
  if (n_kv > c.remaining() / 12)
    c.fail("metadata_kv_count", "metadata count " + std::to_string(n_kv) + " exceeds what the file can hold", at);

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key #" + std::to_string(k));
    GGUFValue v = read_value(c, key);
    metadata_[key] = std::move(v);
  }
  if (const GGUFValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > 1 << 20)
      throw Error(path_ + ": general.alignment must be a power of two, got " + std::to_string(a->u));
    alignment_ = static_cast<uint32_t>(a->u);
  }

  struct RawInfo {
    size_t offset;
    size_t info_at;
  };
  std::vector<RawInfo> raw;
  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorView t;
    const size_t info_at = c.pos();
    t.name = c.read_string("tensor info #" + std::to_string(k) + " name");
    const std::string field = "tensor " + t.name;
    at = c.pos();
    const uint32_t n_dims = c.read<uint32_t>(field + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) c.fail(field, "n_dims " + std::to_string(n_dims) + " outside 1..4", at);
    t.n_dims = static_cast<int>(n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      at = c.pos();
      const uint64_t ne = c.read<uint64_t>(field + " dimension");
      if (ne == 0 || ne > (uint64_t{1} << 40) || numel > (uint64_t{1} << 42) / ne)
        c.fail(field, "absurd dimension " + std::to_string(ne), at);
      t.ne[d] = static_cast<int64_t>(ne);
      numel *= ne;
    }
    at = c.pos();
    const uint32_t type = c.read<uint32_t>(field + " type");
    const DTypeInfo* info = find_dtype_info(type);
    if (!info) c.fail(field, "unknown tensor type id " + std::to_string(type), at);
    t.type = static_cast<DType>(type);
    if (t.ne[0] % info->block_size != 0)
      c.fail(field, "row length " + std::to_string(t.ne[0]) + " is not a multiple of the " + info->name +
                        " block size " + std::to_string(info->block_size), at);
    t.nbytes = static_cast<size_t>(numel / info->block_size * info->block_bytes);
    at = c.pos();
    const uint64_t offset = c.read<uint64_t>(field + " offset");
    if (offset % alignment_ != 0) c.fail(field, "data offset " + std::to_string(offset) + " is not aligned", at);
    raw.push_back({static_cast<size_t>(offset), info_at});
    if (tensor_index_.count(t.name)) c.fail(field, "duplicate tensor name", info_at);
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  c.align_to(alignment_);
  data_offset_ = c.pos();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    TensorView& t = tensors_[k];
    const size_t begin = data_offset_ + raw[k].offset;
    if (data_offset_ > size_ || raw[k].offset > size_ || t.nbytes > size_ || begin + t.nbytes > size_)
      throw Error(path_ + ": tensor " + t.name + " data [" + std::to_string(begin) + ", " +
                  std::to_string(begin + t.nbytes) + ") lies past the end of the file (" + std::to_string(size_) +
                  " bytes; tensor info at offset " + std::to_string(raw[k].info_at) + ")");
    t.data = base_ + begin;
  }
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GGUFValue& GGUFFile::require(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(path_ + ": metadata key " + key + " is missing");
  return *v;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GGUFValue& v, const char* want) {
  throw Error(path + ": metadata key " + key + " has type " + gguf_type_name(v.type) + ", expected " + want);
}
}  // namespace

uint64_t GGUFFile::get_uint(const std::string& key) const {
  const GGUFValue& v = require(key);
  if (!v.is_integer()) wrong_type(path_, key, v, "an integer");
  if (v.i < 0 && v.type != GGUFType::U64) throw Error(path_ + ": metadata key " + key + " is negative");
  return v.u;
}

uint64_t GGUFFile::get_uint(const std::string& key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}

double GGUFFile::get_float(const std::string& key) const {
  const GGUFValue& v = require(key);
  if (!v.is_float() && !v.is_integer()) wrong_type(path_, key, v, "a number");
  return v.f;
}

double GGUFFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GGUFFile::get_bool(const std::string& key, bool fallback) const {
  const GGUFValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer()) wrong_type(path_, key, *v, "a bool");
  return v->u != 0;
}

std::string GGUFFile::get_string(const std::string& key) const {
  const GGUFValue& v = require(key);
  if (v.type != GGUFType::STRING) wrong_type(path_, key, v, "string");
  return v.str;
}

std::string GGUFFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const std::vector<std::string>& GGUFFile::get_string_array(const std::string& key) const {
  const GGUFValue& v = require(key);
  if (v.type != GGUFType::ARRAY || v.elem_type != GGUFType::STRING) wrong_type(path_, key, v, "array of strings");
  return v.strings;
}

const std::vector<double>& GGUFFile::get_number_array(const std::string& key) const {
  const GGUFValue& v = require(key);
  if (v.type != GGUFType::ARRAY || v.elem_type == GGUFType::STRING) wrong_type(path_, key, v, "array of numbers");
  return v.numbers;
}

const TensorView* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView& GGUFFile::tensor(const std::string& name) const {
  const TensorView* t = find_tensor(name);
  if (!t) throw Error(path_ + ": tensor " + name + " not found");
  return *t;
}

}  // namespace kvserve
