#pragma once
// GGUF reader (versions 2 and 3): memory-maps the file, parses the header,
// every metadata key/value and the tensor infos, and exposes tensor data as
// views into the mapping. Every read is bounds-checked; a truncated or
// corrupt file throws kvserve::Error naming the file, the field and the
// offset. After construction all methods are const and thread-compatible.
//
// Memory: what the parse keeps (metadata values, string arrays, tensor infos)
// is counted as it is built and bounded by kGGUFMemoryPerFileByte times the
// file's bytes plus kGGUFMemorySlack; a file that would need more is refused
// before the allocation. Arrays of strings are stored compactly (GGUFStrings:
// at most the file's own bytes), so a real vocabulary stays far below it.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace kvserve {

enum class GGUFType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GGUFType t);

inline constexpr size_t kGGUFMemoryPerFileByte = 4;
inline constexpr size_t kGGUFMemorySlack = size_t{1} << 20;

// An array of strings in one buffer plus an end offset per string: 8 bytes
// an entry, as the file's length prefix, instead of a std::string each.
class GGUFStrings {
 public:
  GGUFStrings() = default;
  GGUFStrings(std::initializer_list<std::string_view> strings);

  size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  std::string_view operator[](size_t i) const;
  std::vector<std::string> to_vector() const;

  void reserve(size_t count, size_t bytes);
  void push_back(std::string_view s);
  // The heap bytes this array holds.
  size_t memory_bytes() const { return bytes_.capacity() + ends_.capacity() * sizeof(uint64_t); }
  bool operator==(const GGUFStrings&) const = default;

 private:
  std::string bytes_;
  std::vector<uint64_t> ends_;  // ends_[i]: one past string i's last byte in bytes_
};

struct GGUFValue {
  GGUFType type = GGUFType::U32;
  GGUFType elem_type = GGUFType::U32;  // arrays only
  // Scalars: integers in `i` (signed view) / `u` (unsigned view), floats in `f`.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string str;
  // Arrays: strings in `strings`, numbers (ints, floats, bools) in `numbers`.
  GGUFStrings strings;
  std::vector<double> numbers;

  bool is_integer() const;
  bool is_float() const { return type == GGUFType::F32 || type == GGUFType::F64; }
  size_t array_size() const { return elem_type == GGUFType::STRING ? strings.size() : numbers.size(); }
};

class GGUFFile {
 public:
  // Throws kvserve::Error if the file cannot be opened or is not valid GGUF.
  explicit GGUFFile(const std::string& path);
  ~GGUFFile();
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t file_size() const { return size_; }
  // Whether p points into the mapped file (not into memory a loader derived from it).
  bool maps(const uint8_t* p) const { return p >= base_ && p < base_ + size_; }
  uint32_t alignment() const { return alignment_; }
  // The heap bytes the parse keeps (the reader's own count; bounded above).
  size_t parsed_memory() const { return parsed_memory_; }

  const std::map<std::string, GGUFValue>& metadata() const { return metadata_; }
  const GGUFValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters. Without a default they throw when the key is missing;
  // they always throw when the key has an incompatible type.
  uint64_t get_uint(const std::string& key) const;
  uint64_t get_uint(const std::string& key, uint64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  const GGUFStrings& get_string_array(const std::string& key) const;
  const std::vector<double>& get_number_array(const std::string& key) const;

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(const std::string& name) const;
  // Throws "PATH: tensor NAME not found".
  const TensorView& tensor(const std::string& name) const;

 private:
  void parse();
  [[noreturn]] static void rethrow_as_error(const std::string& path);
  const GGUFValue& require(const std::string& key) const;

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  size_t parsed_memory_ = 0;
  std::map<std::string, GGUFValue> metadata_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace kvserve
