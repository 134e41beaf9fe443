#include "core/dtype.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace kvserve {
namespace {

struct Entry {
  uint32_t id;
  DTypeInfo info;
};

constexpr Entry kTypes[] = {
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},
    {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},
    {9, {"q8_1", 32, 36, false}},
    {10, {"q2_k", 256, 84, true}},
    {11, {"q3_k", 256, 110, true}},
    {12, {"q4_k", 256, 144, true}},
    {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}},
    {15, {"q8_k", 256, 292, false}},
    {20, {"iq4_nl", 32, 18, true}},
    {23, {"iq4_xs", 256, 136, true}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {30, {"bf16", 1, 2, true}},
};

}  // namespace

const DTypeInfo* find_dtype_info(uint32_t id) {
  for (const auto& e : kTypes)
    if (e.id == id) return &e.info;
  return nullptr;
}

const DTypeInfo& dtype_info(DType t) {
  const DTypeInfo* info = find_dtype_info(static_cast<uint32_t>(t));
  if (!info) throw Error("unknown tensor type id " + std::to_string(static_cast<uint32_t>(t)));
  return *info;
}

const char* dtype_name(DType t) {
  const DTypeInfo* info = find_dtype_info(static_cast<uint32_t>(t));
  return info ? info->name : "unknown";
}

DType parse_dtype(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const auto& e : kTypes)
    if (lower == e.info.name) return static_cast<DType>(e.id);
  throw Error("unknown type '" + name + "' (expected one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k)");
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  check(n % info.block_size == 0, "row length is a multiple of the block size");
  return static_cast<size_t>(n / info.block_size * info.block_bytes);
}

}  // namespace kvserve
