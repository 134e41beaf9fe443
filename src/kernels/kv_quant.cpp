#include "kernels/kv_quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "kernels/dispatch.h"
#include "kernels/fast_exp.h"
#include "kernels/key_lanes.h"
#include "kernels/quantize.h"

namespace kvserve {

#if KVSERVE_HAVE_SIMD
const AttentionVectorOps& avx512_attention_vector_ops();  // kv_quant_avx512.cpp
const AttentionVectorOps& avx2_attention_vector_ops();    // kv_quant_avx2.cpp
#endif

namespace {

constexpr float kE4m3Max = 448.0f;

// The GGUF types that share a layout with a KV type (fp8 has none).
DType weight_dtype(KVType type) {
  switch (type) {
    case KVType::F32: return DType::F32;
    case KVType::F16: return DType::F16;
    case KVType::BF16: return DType::BF16;
    case KVType::Q8_0: return DType::Q8_0;
    case KVType::Q4_0: return DType::Q4_0;
    case KVType::FP8: break;
  }
  check(false, "fp8 has no GGUF twin");
  return DType::F32;
}

// Every e4m3 code's value, so that decoding is one load.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

// The smallest power-of-two exponent e with max_abs / 2^e <= 448, so the
// block's largest value lands in e4m3's top binade without saturating.
int fp8_block_exponent(float max_abs) {
  if (!(max_abs > 0) || std::isinf(max_abs)) return 0;
  int e = 0;
  const float m = std::frexp(max_abs / kE4m3Max, &e);  // max_abs / 448 = m * 2^e, m in [0.5, 1)
  if (m == 0.5f) --e;
  return std::clamp(e, -127, 127);
}

void quantize_fp8_row(const float* src, uint8_t* dst, int64_t n) {
  auto* blocks = reinterpret_cast<Fp8Block*>(dst);
  for (int64_t b = 0; b < n / kFp8BlockElems; ++b) {
    const float* x = src + b * kFp8BlockElems;
    float max_abs = 0;
    for (int i = 0; i < kFp8BlockElems; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
    const int e = fp8_block_exponent(max_abs);
    blocks[b].scale_exp = static_cast<uint8_t>(e + 127);
    for (int i = 0; i < kFp8BlockElems; ++i) blocks[b].q[i] = f32_to_e4m3(std::ldexp(x[i], -e));
  }
}

void dequantize_fp8_row(const uint8_t* src, float* dst, int64_t n) {
  const auto* blocks = reinterpret_cast<const Fp8Block*>(src);
  const auto& table = e4m3_table();
  for (int64_t b = 0; b < n / kFp8BlockElems; ++b) {
    const float scale = std::ldexp(1.0f, blocks[b].scale_exp - 127);
    for (int i = 0; i < kFp8BlockElems; ++i) dst[b * kFp8BlockElems + i] = table[blocks[b].q[i]] * scale;
  }
}

float scalar_dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void scalar_axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scalar_scale(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace

uint8_t f32_to_e4m3(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, 4);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const float a = std::fabs(x);
  if (std::isnan(a)) return sign | 0x7f;
  if (a >= kE4m3Max) return sign | 0x7e;  // saturate (also +-inf)
  if (a < 0.015625f) {                     // below 2^-6: subnormal steps of 2^-9
    // nearbyint rounds half to even in the default rounding mode; 8 steps
    // is 2^-6, whose code (exponent 1, mantissa 0) is also 8.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  const uint32_t abs_bits = bits & 0x7fffffffu;
  // Keep the f32 exponent and top 3 mantissa bits, rounding the 20 dropped
  // bits half to even (a carry rolls into the exponent as it should).
  const uint32_t rounded = (abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);  // rebias the exponent 127 -> 7
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7e));
}

float e4m3_to_f32(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

size_t kv_head_bytes(KVType type, int64_t head_dim) { return static_cast<size_t>(kv_vector_bytes(type, head_dim)); }

bool kv_type_fits(KVType type, int64_t head_dim) {
  return head_dim > 0 && head_dim % kv_type_info(type).block_elems == 0;
}

void require_kv_type_fits(KVType type, int64_t head_dim) {
  if (kv_type_fits(type, head_dim)) return;
  throw Error(std::string("KV type ") + kv_type_info(type).name + " stores blocks of " +
              std::to_string(kv_type_info(type).block_elems) + " elements, but this model's head size is " +
              std::to_string(head_dim) + "; use --kv-type f32, f16 or bf16 for it");
}

void quantize_kv_row(KVType type, const float* src, uint8_t* dst, int64_t n) {
  check(n % kv_type_info(type).block_elems == 0, "KV row length is a multiple of the type's block");
  if (type == KVType::FP8) return quantize_fp8_row(src, dst, n);
  quantize_row(weight_dtype(type), src, dst, n);
}

void quantize_kv_token(KVType type, int64_t n_heads, int64_t head_dim, const float* src, uint8_t* dst,
                       size_t head_stride) {
  for (int64_t h = 0; h < n_heads; ++h)
    quantize_kv_row(type, src + h * head_dim, dst + static_cast<size_t>(h) * head_stride, head_dim);
}

void dequantize_kv_row_scalar(KVType type, const uint8_t* src, float* dst, int64_t n) {
  check(n % kv_type_info(type).block_elems == 0, "KV row length is a multiple of the type's block");
  if (type == KVType::FP8) return dequantize_fp8_row(src, dst, n);
  dequantize_row(weight_dtype(type), src, dst, n);
}

void dequantize_kv_row(KVType type, const uint8_t* src, float* dst, int64_t n) {
  attention_vector_ops().dequantize(type, src, dst, n);
}

void dequantize_kv_rows(const KVRows& rows, int64_t n_kv, int64_t n_kv_heads, int64_t head_dim, float* out) {
  for (int64_t pos = 0; pos < n_kv; ++pos)
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      float* dst = out + (pos * n_kv_heads + h) * head_dim;
      if (rows.keys_in_lanes) dequantize_key_lane(rows.type, rows.lane_group(pos, h), pos % kKeyLanes, head_dim, dst);
      else dequantize_kv_row(rows.type, rows.head(pos, h), dst, head_dim);
    }
}

namespace {
void scalar_dot_keys(const float* const* q, int n_rows, const float* const* k, int64_t n_keys, int64_t n,
                     float* const* out) {
  for (int r = 0; r < n_rows; ++r)
    for (int64_t j = 0; j < n_keys; ++j) out[r][j] = scalar_dot(q[r], k[j], n);
}
void scalar_axpy_keys(const float* const* p, int n_rows, const float* const* v, int64_t n_keys, float* const* y,
                      int64_t n) {
  for (int r = 0; r < n_rows; ++r)
    for (int64_t j = 0; j < n_keys; ++j) scalar_axpy(p[r][j], v[j], y[r], n);
}
float scalar_scale_max(float* x, int64_t n, float scale) { return fast_exp::scale_max_scalar(x, n, scale); }
float scalar_exp_sum(float* x, int64_t n, float shift) { return fast_exp::exp_sum_scalar(x, n, shift); }
}  // namespace

const AttentionVectorOps& scalar_attention_vector_ops() {
  static const AttentionVectorOps ops{scalar_dot,      scalar_axpy,      scalar_scale,    dequantize_kv_row_scalar,
                                      scalar_dot_keys, scalar_axpy_keys, scalar_scale_max, scalar_exp_sum,
                                      nullptr,         scalar_dot_lanes, nullptr,
                                      scalar_dot_lanes_q8};
  return ops;
}

const AttentionVectorOps& attention_vector_ops() {
#if KVSERVE_HAVE_SIMD
  if (active_isa() == Isa::Avx512) return avx512_attention_vector_ops();
  if (active_isa() == Isa::Avx2) return avx2_attention_vector_ops();
#endif
  return scalar_attention_vector_ops();
}

}  // namespace kvserve
