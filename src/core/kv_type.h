#pragma once
// The element types a KV cache can be stored in, their block sizes and names.
// In core/ because both the KV quantization kernels (kernels/kv_quant.h) and
// the KV cache and its planner (kv/) need them, and kernels/ is below kv/.
#include <cstdint>
#include <string>
#include <vector>

namespace kvserve {

// Block types keep one fp16 scale per `block_elems` elements, exactly as the
// quantized weight formats do.
enum class KVType { F32, F16, BF16, Q8_0, FP8, Q4_0 };

struct KVTypeInfo {
  KVType type;
  const char* name;
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
};

const std::vector<KVTypeInfo>& kv_type_infos();
const KVTypeInfo& kv_type_info(KVType type);
// Case-insensitive; an unknown name throws kvserve::Error naming `flag` and the known types.
KVType parse_kv_type(const std::string& name, const std::string& flag);
// Bytes to store one vector of `elems` elements: quantized types round up to whole blocks.
int64_t kv_vector_bytes(KVType type, int64_t elems);

}  // namespace kvserve
