#pragma once
// Builds a GGUF v3 file in memory and writes it out: metadata in insertion
// order, then tensor infos, then aligned tensor data. Used by the converter,
// `synth`, `quantize` and by tests that make their own tiny models.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/gguf.h"

namespace kvserve {

class GGUFWriter {
 public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // Copies a value read by GGUFFile, keeping its exact type (used by `quantize`).
  void set_value(const std::string& key, const GGUFValue& v);

  // ne[0] is the innermost dimension (GGUF order). `bytes` must hold exactly
  // the tensor's encoded size; it is copied.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& ne, const void* bytes,
                  size_t nbytes);
  void add_f32_tensor(const std::string& name, const std::vector<int64_t>& ne, const std::vector<float>& values);

  // Writes the file; throws kvserve::Error on an I/O failure.
  void write(const std::string& path) const;
  // The whole file as bytes (tests corrupt these on purpose).
  std::vector<uint8_t> serialize() const;

  static constexpr uint32_t kAlignment = 32;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  void begin_kv(const std::string& key, uint32_t type);

  std::vector<uint8_t> kv_bytes_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace kvserve
