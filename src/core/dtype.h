#pragma once
// Tensor element types, numbered as in GGUF / ggml so that a file's type id
// is our enum value.
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvserve {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct DTypeInfo {
  const char* name;
  int64_t block_size;  // elements per block (1 for plain types)
  int64_t block_bytes; // bytes per block
  bool supported;      // whether kvserve's kernels can compute with it
};

// Returns nullptr for an id that no known type has.
const DTypeInfo* find_dtype_info(uint32_t id);
// Throws kvserve::Error for an unknown id.
const DTypeInfo& dtype_info(DType t);
const char* dtype_name(DType t);
// Parses "f32", "q8_0", ... (case-insensitive); throws on an unknown name.
DType parse_dtype(const std::string& name);
// Bytes taken by n elements; n must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);

// Block layouts, bit-exact with ggml.
constexpr int kQK4_0 = 32;
constexpr int kQK4_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;

struct BlockQ4_0 {
  uint16_t d;           // fp16 scale
  uint8_t qs[kQK4_0 / 2]; // nibbles: element j in low nibble of qs[j], j+16 in high
};
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 min
  uint8_t qs[kQK4_1 / 2];
};
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);

}  // namespace kvserve
