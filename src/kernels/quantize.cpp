#include "kernels/quantize.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kernels/quantize_kquants.h"

namespace kvserve {
namespace {

void dequantize_q4_0(const BlockQ4_0* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[i * kQK4_0 + j] = static_cast<float>((b[i].qs[j] & 0x0f) - 8) * d;
      y[i * kQK4_0 + j + kQK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const float m = fp16_to_f32(b[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      y[i * kQK4_1 + j] = static_cast<float>(b[i].qs[j] & 0x0f) * d + m;
      y[i * kQK4_1 + j + kQK4_1 / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* b, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    float amax = 0;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[i * kQK8_0 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[i * kQK8_0 + j] * id));
  }
}

void quantize_q4_0(const float* x, BlockQ4_0* b, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float* xb = x + i * kQK4_0;
    float amax = 0, max = 0;
    for (int j = 0; j < kQK4_0; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(xb[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(xb[j + kQK4_0 / 2] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* b, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const float* xb = x + i * kQK4_1;
    float min = xb[0], max = xb[0];
    for (int j = 1; j < kQK4_1; ++j) {
      min = std::fmin(min, xb[j]);
      max = std::fmax(max, xb[j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = f32_to_fp16(d);
    b[i].m = f32_to_fp16(min);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>((xb[j] - min) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((xb[j + kQK4_1 / 2] - min) * id + 0.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q5_0, Q5_1, the IQ4 types and the K-quants, one block at a time (kernels/quantize_kquants.h).
template <typename Block, int kBlockSize>
void dequantize_blocks(void (*one)(const Block&, float*), const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kBlockSize; ++i) one(b[i], y + i * kBlockSize);
}
template <typename Block, int kBlockSize>
void quantize_blocks(void (*one)(const float*, Block&), const float* x, void* dst, int64_t n) {
  auto* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kBlockSize; ++i) one(x + i * kBlockSize, b[i]);
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q4_0: return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, n);
    case DType::Q4_1: return dequantize_q4_1(static_cast<const BlockQ4_1*>(src), dst, n);
    case DType::Q8_0: return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, n);
    case DType::Q5_0: return dequantize_blocks<BlockQ5_0, kQK4_0>(dequantize_block_q5_0, src, dst, n);
    case DType::Q5_1: return dequantize_blocks<BlockQ5_1, kQK4_1>(dequantize_block_q5_1, src, dst, n);
    case DType::IQ4_NL: return dequantize_blocks<BlockIQ4_NL, kQK4_NL>(dequantize_block_iq4_nl, src, dst, n);
    case DType::IQ4_XS: return dequantize_blocks<BlockIQ4_XS, kQK_K>(dequantize_block_iq4_xs, src, dst, n);
    case DType::Q2_K: return dequantize_blocks<BlockQ2_K, kQK_K>(dequantize_block_q2_k, src, dst, n);
    case DType::Q3_K: return dequantize_blocks<BlockQ3_K, kQK_K>(dequantize_block_q3_k, src, dst, n);
    case DType::Q4_K: return dequantize_blocks<BlockQ4_K, kQK_K>(dequantize_block_q4_k, src, dst, n);
    case DType::Q5_K: return dequantize_blocks<BlockQ5_K, kQK_K>(dequantize_block_q5_k, src, dst, n);
    case DType::Q6_K: return dequantize_blocks<BlockQ6_K, kQK_K>(dequantize_block_q6_k, src, dst, n);
    default:
      throw Error(std::string("dequantize: tensor type ") + dtype_name(type) + " is not supported");
  }
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0: return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
    case DType::Q4_1: return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), n);
    case DType::Q8_0: return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case DType::Q5_0: return quantize_blocks<BlockQ5_0, kQK4_0>(quantize_block_q5_0, src, dst, n);
    case DType::Q5_1: return quantize_blocks<BlockQ5_1, kQK4_1>(quantize_block_q5_1, src, dst, n);
    case DType::IQ4_NL: return quantize_blocks<BlockIQ4_NL, kQK4_NL>(quantize_block_iq4_nl, src, dst, n);
    case DType::IQ4_XS: return quantize_blocks<BlockIQ4_XS, kQK_K>(quantize_block_iq4_xs, src, dst, n);
    case DType::Q2_K: return quantize_blocks<BlockQ2_K, kQK_K>(quantize_block_q2_k, src, dst, n);
    case DType::Q3_K: return quantize_blocks<BlockQ3_K, kQK_K>(quantize_block_q3_k, src, dst, n);
    case DType::Q4_K: return quantize_blocks<BlockQ4_K, kQK_K>(quantize_block_q4_k, src, dst, n);
    case DType::Q5_K: return quantize_blocks<BlockQ5_K, kQK_K>(quantize_block_q5_k, src, dst, n);
    case DType::Q6_K: return quantize_blocks<BlockQ6_K, kQK_K>(quantize_block_q6_k, src, dst, n);
    default:
      throw Error(std::string("quantize: tensor type ") + dtype_name(type) + " is not supported");
  }
}

void quantize_row_searched(DType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case DType::Q4_K: return quantize_blocks<BlockQ4_K, kQK_K>(quantize_block_q4_k_searched, src, dst, n);
    case DType::Q5_K: return quantize_blocks<BlockQ5_K, kQK_K>(quantize_block_q5_k_searched, src, dst, n);
    case DType::Q6_K: return quantize_blocks<BlockQ6_K, kQK_K>(quantize_block_q6_k_searched, src, dst, n);
    default: return quantize_row(type, src, dst, n);
  }
}

}  // namespace kvserve
