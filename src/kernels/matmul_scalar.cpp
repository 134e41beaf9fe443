// Portable kernels: what every SIMD path must agree with up to float rounding.
// Quantized weights use the same 8-bit activations and per-block integer dot
// products as the SIMD paths, written in plain C++.
#include "core/dtype.h"
#include "core/half.h"
#include "kernels/kernel_table.h"

namespace kvserve {
namespace {

template <typename ToFloat>
struct FloatRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    for (int r = 0; r < R; ++r) {
      const auto* w = reinterpret_cast<const typename ToFloat::Storage*>(job.w + (first_row + r * row_step) * job.row_bytes);
      float acc[N] = {};
      for (int64_t c = 0; c < job.cols; ++c) {
        const float wc = ToFloat::convert(w[c]);
        for (int i = 0; i < N; ++i) acc[i] += wc * job.x[(first_token + i) * job.cols + c];
      }
      for (int i = 0; i < N; ++i) out[r * N + i] = acc[i];
    }
  }
};

struct F32ToFloat {
  using Storage = float;
  static float convert(float v) { return v; }
};
struct F16ToFloat {
  using Storage = uint16_t;
  static float convert(uint16_t v) { return fp16_to_f32(v); }
};
struct BF16ToFloat {
  using Storage = uint16_t;
  static float convert(uint16_t v) { return bf16_to_f32(v); }
};

// Per block: dw * dx * sum(q_w * q_x), plus m * s for Q4_1's offset m.
// Q4 activations come in Q8Order::NibblePairs, Q8_0's in Q8Order::Plain.
int32_t q4_0_block_dot(const BlockQ4_0& w, const int8_t* qx, Q8HalfOffsets at) {
  int32_t sum = 0;
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    sum += ((w.qs[j] & 0x0f) - 8) * qx[at.first + j];
    sum += ((w.qs[j] >> 4) - 8) * qx[at.second + j];
  }
  return sum;
}

int32_t q4_1_block_dot(const BlockQ4_1& w, const int8_t* qx, Q8HalfOffsets at) {
  int32_t sum = 0;
  for (int j = 0; j < kQK4_1 / 2; ++j) {
    sum += (w.qs[j] & 0x0f) * qx[at.first + j];
    sum += (w.qs[j] >> 4) * qx[at.second + j];
  }
  return sum;
}

int32_t q8_0_block_dot(const BlockQ8_0& w, const int8_t* qx, Q8HalfOffsets at) {
  int32_t sum = 0;
  for (int j = 0; j < kQK8_0 / 2; ++j) {
    sum += w.qs[j] * qx[at.first + j];
    sum += w.qs[j + kQK8_0 / 2] * qx[at.second + j];
  }
  return sum;
}

float block_offset(const BlockQ4_0&) { return 0.0f; }
float block_offset(const BlockQ4_1& w) { return fp16_to_f32(w.m); }
float block_offset(const BlockQ8_0&) { return 0.0f; }

int32_t block_dot(const BlockQ4_0& w, const int8_t* qx, Q8HalfOffsets at) { return q4_0_block_dot(w, qx, at); }
int32_t block_dot(const BlockQ4_1& w, const int8_t* qx, Q8HalfOffsets at) { return q4_1_block_dot(w, qx, at); }
int32_t block_dot(const BlockQ8_0& w, const int8_t* qx, Q8HalfOffsets at) { return q8_0_block_dot(w, qx, at); }

template <typename Block, Q8Order kOrder>
struct QuantRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const int64_t n_blocks = job.cols / 32;
    for (int r = 0; r < R; ++r) {
      const auto* blocks = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
      for (int i = 0; i < N; ++i) {
        const Q8ActRow a = q8_act_row(job, first_token + i);
        float acc = 0;
        for (int64_t b = 0; b < n_blocks; ++b) {
          const int32_t sum = block_dot(blocks[b], a.qs, q8_half_offsets(kOrder, b, n_blocks));
          acc += fp16_to_f32(blocks[b].d) * a.scales[b].d * static_cast<float>(sum) + block_offset(blocks[b]) * a.scales[b].s;
        }
        out[r * N + i] = acc;
      }
    }
  }
};

// f32 activations: each weight block dequantized (as dequantize_row does),
// then a plain float dot product.
template <typename Block>
struct ExactRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const int64_t n_blocks = job.cols / 32;
    float w[32];
    for (int r = 0; r < R; ++r) {
      const auto* blocks = reinterpret_cast<const Block*>(job.w + (first_row + r * row_step) * job.row_bytes);
      float acc[N] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        dequantize_block(blocks[b], w);
        for (int i = 0; i < N; ++i) {
          const float* x = job.x + (first_token + i) * job.cols + b * 32;
          for (int j = 0; j < 32; ++j) acc[i] += w[j] * x[j];
        }
      }
      for (int i = 0; i < N; ++i) out[r * N + i] = acc[i];
    }
  }
  static void dequantize_block(const BlockQ4_0& blk, float* w) {
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<float>((blk.qs[j] & 0x0f) - 8) * d;
      w[j + 16] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
    }
  }
  static void dequantize_block(const BlockQ4_1& blk, float* w) {
    const float d = fp16_to_f32(blk.d), m = fp16_to_f32(blk.m);
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<float>(blk.qs[j] & 0x0f) * d + m;
      w[j + 16] = static_cast<float>(blk.qs[j] >> 4) * d + m;
    }
  }
  static void dequantize_block(const BlockQ8_0& blk, float* w) {
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < 32; ++j) w[j] = static_cast<float>(blk.qs[j]) * d;
  }
};

}  // namespace

const KernelTable& scalar_kernel_table() {
  static const KernelTable table = {
    Isa::Scalar,
    run_row_tiles<FloatRowDot<F32ToFloat>>,
    run_row_tiles<FloatRowDot<F16ToFloat>>,
    run_row_tiles<FloatRowDot<BF16ToFloat>>,
    run_row_tiles<QuantRowDot<BlockQ4_0, Q8Order::NibblePairs>>,
    run_row_tiles<QuantRowDot<BlockQ4_1, Q8Order::NibblePairs>>,
    run_row_tiles<QuantRowDot<BlockQ8_0, Q8Order::Plain>>,
    run_row_tiles<ExactRowDot<BlockQ4_0>>,
    run_row_tiles<ExactRowDot<BlockQ4_1>>,
    run_row_tiles<ExactRowDot<BlockQ8_0>>,
    scalar_kquant_kernels(),
  };
  return table;
}

}  // namespace kvserve
