#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <utility>

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

  // A length-prefixed string, as a view into the mapping (nothing allocated).
  std::string_view read_string_view(const std::string& field) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(field);
    if (len > remaining()) fail(field, "string length " + std::to_string(len) + " runs past the end of file", at);
    const std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  void seek(size_t pos) { pos_ = pos; }
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

// The heap bytes of a std::string of `len` bytes (libstdc++ keeps up to 15 inline).
uint64_t string_heap_bytes(uint64_t len) { return len > 15 ? len + 1 : 0; }
// A std::map node's bookkeeping and the allocator's, beyond its value.
constexpr uint64_t kMapNodeBytes = 48;

// Counts the heap bytes the parse keeps, refusing (before the allocation)
// what would take more than kGGUFMemoryPerFileByte x the file's bytes plus
// kGGUFMemorySlack: no file makes the reader allocate out of proportion to it.
class MemoryBudget {
 public:
  MemoryBudget(const Cursor& cursor, size_t file_size)
      : cursor_(cursor),
        limit_(file_size > (SIZE_MAX - kGGUFMemorySlack) / kGGUFMemoryPerFileByte
                   ? SIZE_MAX
                   : file_size * kGGUFMemoryPerFileByte + kGGUFMemorySlack) {}

  // `count` items of `item_bytes` each (overflow-checked).
  void charge(uint64_t count, uint64_t item_bytes, const std::string& field, size_t at) {
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(count, item_bytes, &bytes) || bytes > limit_ - used_)
      cursor_.fail(field, "the file's metadata would take more than " + std::to_string(limit_) + " bytes of memory (" +
                              std::to_string(kGGUFMemoryPerFileByte) + "x the file's bytes + 1 MiB)", at);
    used_ += bytes;
  }
  size_t used() const { return used_; }

 private:
  const Cursor& cursor_;
  size_t limit_;
  size_t used_ = 0;
};

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
    case GGUFType::STRING: case GGUFType::ARRAY: break;  // handled by the caller
  }
  if (t != GGUFType::F32 && t != GGUFType::F64 && t != GGUFType::STRING) v.f = static_cast<double>(v.i);
  if (t == GGUFType::U64) v.f = static_cast<double>(v.u);
}

// An array of `count` strings: a first pass checks every length against the
// file and sums them, so the compact copy is charged and sized exactly once.
void read_string_array(Cursor& c, uint64_t count, GGUFValue& v, MemoryBudget& budget, const std::string& key) {
  const size_t first = c.pos();
  const std::string field = key + " (array element)";
  uint64_t bytes = 0;
  for (uint64_t k = 0; k < count; ++k) bytes += c.read_string_view(field).size();
  budget.charge(count, sizeof(uint64_t), key, first);
  budget.charge(bytes, 1, key, first);
  v.strings.reserve(count, bytes);
  c.seek(first);
  for (uint64_t k = 0; k < count; ++k) v.strings.push_back(c.read_string_view(key));
}

GGUFValue read_value(Cursor& c, MemoryBudget& budget, const std::string& key) {
  GGUFValue v;
  const size_t at = c.pos();
  const uint32_t type = c.read<uint32_t>(key + " (value type)");
  if (!valid_type(type)) c.fail(key, "invalid value type " + std::to_string(type), at);
  v.type = static_cast<GGUFType>(type);
  if (v.type == GGUFType::STRING) {
    const std::string_view s = c.read_string_view(key);
    budget.charge(string_heap_bytes(s.size()), 1, key, at);
    v.str = s;
    return v;
  }
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
    read_string_array(c, count, v, budget, key);
    return v;
  }
  budget.charge(count, sizeof(double), key, count_at);
  v.numbers.reserve(count);
  GGUFValue e;
  for (uint64_t k = 0; k < count; ++k) {
    read_scalar(c, v.elem_type, e, key);
    v.numbers.push_back(e.f);
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

GGUFStrings::GGUFStrings(std::initializer_list<std::string_view> strings) {
  for (std::string_view s : strings) push_back(s);
}

std::string_view GGUFStrings::operator[](size_t i) const {
  const size_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(bytes_).substr(begin, ends_[i] - begin);
}

std::vector<std::string> GGUFStrings::to_vector() const {
  std::vector<std::string> out;
  out.reserve(size());
  for (size_t i = 0; i < size(); ++i) out.emplace_back((*this)[i]);
  return out;
}

void GGUFStrings::reserve(size_t count, size_t bytes) {
  ends_.reserve(count);
  bytes_.reserve(bytes);
}

void GGUFStrings::push_back(std::string_view s) {
  bytes_.append(s);
  ends_.push_back(bytes_.size());
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
    rethrow_as_error(path);
  }
}

// The last line of defence: a standard-library exception from the parse
// (bad_alloc, length_error, out_of_range) leaves as an Error naming the file.
void GGUFFile::rethrow_as_error(const std::string& path) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(path + ": out of memory while reading the GGUF metadata");
  } catch (const std::exception& e) {
    throw Error(path + ": cannot read the GGUF metadata: " + e.what());
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

  MemoryBudget budget(c, size_);
  for (uint64_t k = 0; k < n_kv; ++k) {
    at = c.pos();
    const std::string_view key_bytes = c.read_string_view("metadata key #" + std::to_string(k));
    budget.charge(1, kMapNodeBytes + sizeof(std::pair<const std::string, GGUFValue>) + string_heap_bytes(key_bytes.size()),
                  "metadata key #" + std::to_string(k), at);
    std::string key(key_bytes);
    GGUFValue v = read_value(c, budget, key);
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
  budget.charge(n_tensors,
                sizeof(TensorView) + sizeof(RawInfo) + kMapNodeBytes + sizeof(std::pair<const std::string, size_t>),
                "tensor_count", 8);
  raw.reserve(n_tensors);
  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorView t;
    const size_t info_at = c.pos();
    const std::string_view name = c.read_string_view("tensor info #" + std::to_string(k) + " name");
    // Twice: the tensor's name and its index entry's key.
    budget.charge(2, string_heap_bytes(name.size()), "tensor info #" + std::to_string(k) + " name", info_at);
    t.name = name;
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
  const size_t data_offset = c.pos();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    TensorView& t = tensors_[k];
    const size_t begin = data_offset + raw[k].offset;
    if (data_offset > size_ || raw[k].offset > size_ || t.nbytes > size_ || begin + t.nbytes > size_)
      throw Error(path_ + ": tensor " + t.name + " data [" + std::to_string(begin) + ", " +
                  std::to_string(begin + t.nbytes) + ") lies past the end of the file (" + std::to_string(size_) +
                  " bytes; tensor info at offset " + std::to_string(raw[k].info_at) + ")");
    t.data = base_ + begin;
  }
  parsed_memory_ = budget.used();
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

const GGUFStrings& GGUFFile::get_string_array(const std::string& key) const {
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
