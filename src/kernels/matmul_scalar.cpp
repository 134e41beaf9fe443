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
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* w = reinterpret_cast<const typename ToFloat::Storage*>(job.w + row * job.row_bytes);
    float acc[N] = {};
    for (int64_t c = 0; c < job.cols; ++c) {
      const float wc = ToFloat::convert(w[c]);
      for (int i = 0; i < N; ++i) acc[i] += wc * job.x[(first_token + i) * job.cols + c];
    }
    for (int i = 0; i < N; ++i) out[i] = acc[i];
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

// Per block: d_w * d_x * sum(q_w * q_x), plus m_w * s_x for Q4_1's offset.
struct Q4_0RowDot {
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* blocks = reinterpret_cast<const BlockQ4_0*>(job.w + row * job.row_bytes);
    float acc[N] = {};
    for (int64_t b = 0; b < job.cols / kQK4_0; ++b) {
      const float dw = fp16_to_f32(blocks[b].d);
      for (int i = 0; i < N; ++i) {
        const Q8ActRow a = job.act(first_token + i);
        const int8_t* qa = a.qs + b * kQK4_0;
        int32_t sum = 0;
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          sum += ((blocks[b].qs[j] & 0x0f) - 8) * qa[j];
          sum += ((blocks[b].qs[j] >> 4) - 8) * qa[j + kQK4_0 / 2];
        }
        acc[i] += dw * a.scales[b].d * static_cast<float>(sum);
      }
    }
    for (int i = 0; i < N; ++i) out[i] = acc[i];
  }
};

struct Q4_1RowDot {
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* blocks = reinterpret_cast<const BlockQ4_1*>(job.w + row * job.row_bytes);
    float acc[N] = {};
    for (int64_t b = 0; b < job.cols / kQK4_1; ++b) {
      const float dw = fp16_to_f32(blocks[b].d), mw = fp16_to_f32(blocks[b].m);
      for (int i = 0; i < N; ++i) {
        const Q8ActRow a = job.act(first_token + i);
        const int8_t* qa = a.qs + b * kQK4_1;
        int32_t sum = 0;
        for (int j = 0; j < kQK4_1 / 2; ++j) {
          sum += (blocks[b].qs[j] & 0x0f) * qa[j];
          sum += (blocks[b].qs[j] >> 4) * qa[j + kQK4_1 / 2];
        }
        acc[i] += dw * a.scales[b].d * static_cast<float>(sum) + mw * a.scales[b].s;
      }
    }
    for (int i = 0; i < N; ++i) out[i] = acc[i];
  }
};

struct Q8_0RowDot {
  template <int N>
  static void dot(const MatmulJob& job, int64_t row, int64_t first_token, float* out) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(job.w + row * job.row_bytes);
    float acc[N] = {};
    for (int64_t b = 0; b < job.cols / kQK8_0; ++b) {
      const float dw = fp16_to_f32(blocks[b].d);
      for (int i = 0; i < N; ++i) {
        const Q8ActRow a = job.act(first_token + i);
        const int8_t* qa = a.qs + b * kQK8_0;
        int32_t sum = 0;
        for (int j = 0; j < kQK8_0; ++j) sum += blocks[b].qs[j] * qa[j];
        acc[i] += dw * a.scales[b].d * static_cast<float>(sum);
      }
    }
    for (int i = 0; i < N; ++i) out[i] = acc[i];
  }
};

constexpr KernelTable kScalarTable = {
    Isa::Scalar,
    run_row_tiles<FloatRowDot<F32ToFloat>>,
    run_row_tiles<FloatRowDot<F16ToFloat>>,
    run_row_tiles<FloatRowDot<BF16ToFloat>>,
    run_row_tiles<Q4_0RowDot>,
    run_row_tiles<Q4_1RowDot>,
    run_row_tiles<Q8_0RowDot>,
};

}  // namespace

const KernelTable& scalar_kernel_table() { return kScalarTable; }

}  // namespace kvserve
