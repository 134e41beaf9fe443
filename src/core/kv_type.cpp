#include "core/kv_type.h"

#include <cctype>

#include "core/error.h"

namespace kvserve {

const std::vector<KVTypeInfo>& kv_type_infos() {
  // Block types: int8 / e4m3 / packed int4 values plus one fp16 scale per 32.
  static const std::vector<KVTypeInfo> infos = {
      {KVType::F32, "f32", 1, 4},     {KVType::F16, "f16", 1, 2},   {KVType::BF16, "bf16", 1, 2},
      {KVType::Q8_0, "q8_0", 32, 34}, {KVType::FP8, "fp8", 32, 33}, {KVType::Q4_0, "q4_0", 32, 18},
  };
  return infos;
}

const KVTypeInfo& kv_type_info(KVType type) {
  for (const KVTypeInfo& info : kv_type_infos())
    if (info.type == type) return info;
  check(false, "every KVType has an entry in kv_type_infos()");
  return kv_type_infos().front();
}

KVType parse_kv_type(const std::string& name, const std::string& flag) {
  std::string key = name;
  for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string known;
  for (const KVTypeInfo& info : kv_type_infos()) {
    if (key == info.name) return info.type;
    known += known.empty() ? info.name : std::string(", ") + info.name;
  }
  throw Error(flag + ": unknown KV type '" + name + "' (known: " + known + ")");
}

int64_t kv_vector_bytes(KVType type, int64_t elems) {
  const KVTypeInfo& info = kv_type_info(type);
  // The engine cannot store part of a block, so a ragged tail costs a whole one.
  const int64_t blocks = (elems + info.block_elems - 1) / info.block_elems;
  return blocks * info.block_bytes;
}

}  // namespace kvserve
