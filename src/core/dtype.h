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
  IQ4_NL = 20,
  IQ4_XS = 23,
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
// Q5_0: w = d * (q - 16), q = low nibble | (bit of qh) << 4. Element j < 16
// is qs[j]'s low nibble with qh bit j; element j + 16 its high nibble with bit j + 16.
struct BlockQ5_0 {
  uint16_t d;             // fp16 scale
  uint8_t qh[4];          // bit j: fifth bit of element j (little-endian uint32)
  uint8_t qs[kQK4_0 / 2]; // low 4 bits, as in Q4_0
};
// Q5_1: w = d * q + m, q = low nibble | (bit of qh) << 4 in 0..31, laid out as
// Q5_0 (element j < 16: qs[j] low nibble, qh bit j; j + 16: high nibble, bit j + 16).
struct BlockQ5_1 {
  uint16_t d;             // fp16 scale
  uint16_t m;             // fp16 min
  uint8_t qh[4];          // bit j: fifth bit of element j (little-endian uint32)
  uint8_t qs[kQK4_1 / 2]; // low 4 bits, as in Q4_1
};

// IQ4_NL: w = d * kIQ4NLValues[index], 4-bit indices laid out as Q4_0's
// nibbles (element j < 16: qs[j] low nibble; j + 16: its high nibble).
constexpr int kQK4_NL = 32;
struct BlockIQ4_NL {
  uint16_t d;               // fp16 scale
  uint8_t qs[kQK4_NL / 2];  // indices into kIQ4NLValues
};
// ggml's kvalues_iq4nl: the 16 signed levels IQ4_NL and IQ4_XS index.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Q2_K: 16 sub-blocks of 16, w = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4),
// q in 0..3. Value i (h = i / 128, k = i % 128 / 32, l = i % 32) is bits
// 2k, 2k + 1 of qs[32h + l]; its group g = i / 16.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // low nibble: scale, high nibble: min, per 16 values
  uint8_t qs[kQK_K / 4];
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
};
// Q3_K: 16 sub-blocks of 16, w = d * (sc_g - 32) * q, q in -4..3: the low two
// bits as Q2_K's, minus 4 unless bit 4h + k of hmask[l] is set; sc_g 6-bit
// (q3_k_scale).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
// Group g's signed scale sc_g - 32 (-32..31): the low four bits are nibble
// g / 8 of byte g % 8, the top two bits 2 (g / 4), 2 (g / 4) + 1 of byte 8 + g % 4.
static inline int q3_k_scale(const uint8_t* scales, int g) {
  const int low = (scales[g % 8] >> (4 * (g / 8))) & 15, high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
  return (low | high << 4) - 32;
}

// IQ4_XS: 8 sub-blocks of 32, w = d * (ls_j - 32) * kIQ4NLValues[index]
// with 6-bit ls_j (see iq4_xs_scale); sub-block j's indices are qs[16j ..
// 16j + 15] in IQ4_NL's nibble order.
struct BlockIQ4_XS {
  uint16_t d;            // fp16 super-block scale
  uint16_t scales_h;     // bits 2j, 2j + 1: the top two bits of ls_j
  uint8_t scales_l[4];   // nibble j % 2 of byte j / 2: the low four bits of ls_j
  uint8_t qs[kQK_K / 2];
};
// Sub-block j's signed scale ls_j - 32 (-32..31). `static`, as kquant_scale_min.
static inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  const int low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 15, high = (b.scales_h >> (2 * j)) & 3;
  return (low | high << 4) - 32;
}

// K-quants: super-blocks of 256 values.
//
// Q4_K / Q5_K: 8 sub-blocks of 32, w = d * sc[j] * q - dmin * m[j] with 6-bit
// sc[j], m[j] packed in 12 bytes (see kquant_scale_min). In each 64-value
// chunk k, qs[32k + l]'s low nibble is value 64k + l and its high nibble
// value 64k + 32 + l. Q5_K's fifth bits: qh[l] bit 2k for value 64k + l,
// bit 2k + 1 for value 64k + 32 + l.
constexpr int kKScaleBytes = 12;
struct BlockQ4_K {
  uint16_t d;     // fp16 super-block scale of the sub-block scales
  uint16_t dmin;  // fp16 super-block scale of the sub-block mins
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// Q6_K: 16 sub-blocks of 16, w = d * scales[i / 16] * (q - 32), q in 0..63.
// In each 128-value half h (ql += 64 h, qh += 32 h), for l < 32: value l is
// ql[l] & 15, value 32 + l is ql[32 + l] & 15, value 64 + l is ql[l] >> 4,
// value 96 + l is ql[32 + l] >> 4; qh[l] bits 2g, 2g + 1 are the top two bits
// of value 32 g + l.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};

// Sub-block j's (scale, min) of a Q4_K / Q5_K super-block: for j < 4 the low
// 6 bits of bytes j and j + 4; for j >= 4 the nibbles of byte j + 4 with the
// top two bits of bytes j - 4 and j. `static` (one copy per translation
// unit): the SIMD kernel files include this header with -mavx2 / -mavx512f.
struct KScaleMin {
  uint8_t scale, min;
};
static inline KScaleMin kquant_scale_min(const uint8_t* scales, int j) {
  if (j < 4) return {static_cast<uint8_t>(scales[j] & 63), static_cast<uint8_t>(scales[j + 4] & 63)};
  return {static_cast<uint8_t>((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4)),
          static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))};
}

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);

}  // namespace kvserve
