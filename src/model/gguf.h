#pragma once
// GGUF reader (versions 2 and 3): memory-maps the file, parses the header,
// every metadata key/value and the tensor infos, and exposes tensor data as
// views into the mapping. Every read is bounds-checked; a truncated or
// corrupt file throws kvserve::Error naming the file, the field and the
// offset. After construction all methods are const and thread-compatible.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kvserve {

enum class GGUFType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GGUFType t);

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
  std::vector<std::string> strings;
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
  size_t data_offset() const { return data_offset_; }
  uint32_t alignment() const { return alignment_; }

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
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  const std::vector<double>& get_number_array(const std::string& key) const;

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(const std::string& name) const;
  // Throws "PATH: tensor NAME not found".
  const TensorView& tensor(const std::string& name) const;

 private:
  void parse();
  const GGUFValue& require(const std::string& key) const;

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::map<std::string, GGUFValue> metadata_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace kvserve
