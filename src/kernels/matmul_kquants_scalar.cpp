// Portable Q5_0 / Q5_1 / IQ4_NL / IQ4_XS / K-quant (Q2_K..Q6_K) kernels: the reference every SIMD path of these
// types is tested against. 8-bit activations come in Q8Order::Plain (blocks of
// 32 in element order); each weight block's contribution is an exact integer
// dot per 32 values, scaled in float. f32 activations: dequantize a block
// (quantize_kquants.h), then a plain float dot.
#include "core/dtype.h"
#include "core/half.h"
#include "kernels/kernel_table.h"
#include "kernels/quantize_kquants.h"

namespace kvserve {
namespace {

// Each format: kValues per weight block and q8_block(b, qx, scales), the
// block's dot with kValues / 32 activation blocks.
struct Q5_0Format {
  using Block = BlockQ5_0;
  static constexpr int kValues = kQK4_0;
  // w = d * q - 16 d: d * dx * dot(q, qx) - 16 d * s
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += q5_0_value(b, i) * qx[i];
    const float d = fp16_to_f32(b.d);
    return d * sc[0].d * static_cast<float>(dot) - 16.0f * d * sc[0].s;
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_q5_0(b, w); }
};

struct Q5_1Format {
  using Block = BlockQ5_1;
  static constexpr int kValues = kQK4_1;
  // w = d * q + m: d * dx * dot(q, qx) + m * s
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += q5_1_value(b, i) * qx[i];
    return fp16_to_f32(b.d) * sc[0].d * static_cast<float>(dot) + fp16_to_f32(b.m) * sc[0].s;
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_q5_1(b, w); }
};

// IQ4_NL: w = d * level, level = kIQ4NLValues[index] (signed, no offset).
struct IQ4_NLFormat {
  using Block = BlockIQ4_NL;
  static constexpr int kValues = kQK4_NL;
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += kIQ4NLValues[iq4_nl_index(b, i)] * qx[i];
    return fp16_to_f32(b.d) * sc[0].d * static_cast<float>(dot);
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_iq4_nl(b, w); }
};

// IQ4_XS: sub-block j contributes d (ls_j - 32) dx_j dot(level, qx).
struct IQ4_XSFormat {
  using Block = BlockIQ4_XS;
  static constexpr int kValues = kQK_K;
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    const float d = fp16_to_f32(b.d);
    float sum = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int l = 32 * j; l < 32 * j + 32; ++l) dot += kIQ4NLValues[iq4_xs_index(b, l)] * qx[l];
      sum += d * static_cast<float>(iq4_xs_scale(b, j)) * sc[j].d * static_cast<float>(dot);
    }
    return sum;
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_iq4_xs(b, w); }
};

// Q2_K: activation block j (32 values) spans groups 2j, 2j + 1:
// d dx_j sum_g sc_g dot(q, qx)_g - dmin dx_j sum_g m_g sum(qx)_g.
struct Q2_KFormat {
  using Block = BlockQ2_K;
  static constexpr int kValues = kQK_K;
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    float sum = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t scaled = 0, mins = 0;
      for (int g = 2 * j; g < 2 * j + 2; ++g) {
        int32_t dot = 0, xsum = 0;
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          dot += q2_k_value(b, l) * qx[l];
          xsum += qx[l];
        }
        scaled += (b.scales[g] & 15) * dot;
        mins += (b.scales[g] >> 4) * xsum;
      }
      sum += d * sc[j].d * static_cast<float>(scaled) - dmin * sc[j].d * static_cast<float>(mins);
    }
    return sum;
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_q2_k(b, w); }
};

// Q3_K: as Q6_K, d dx_j sum_g (sc_g - 32) dot(q, qx)_g with q in -4..3.
struct Q3_KFormat {
  using Block = BlockQ3_K;
  static constexpr int kValues = kQK_K;
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    const float d = fp16_to_f32(b.d);
    float sum = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t scaled = 0;
      for (int g = 2 * j; g < 2 * j + 2; ++g) {
        int32_t dot = 0;
        for (int l = 16 * g; l < 16 * g + 16; ++l) dot += q3_k_value(b, l) * qx[l];
        scaled += q3_k_scale(b.scales, g) * dot;
      }
      sum += d * sc[j].d * static_cast<float>(scaled);
    }
    return sum;
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_q3_k(b, w); }
};

// Q4_K / Q5_K: sub-block j contributes d sc_j dx_j dot_j - dmin m_j s_j.
template <typename BlockT, int (*Value)(const BlockT&, int), void (*Dequantize)(const BlockT&, float*)>
struct KFormat {
  using Block = BlockT;
  static constexpr int kValues = kQK_K;
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    float sum = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) dot += Value(b, 32 * j + l) * qx[32 * j + l];
      const KScaleMin sm = kquant_scale_min(b.scales, j);
      sum += d * sm.scale * sc[j].d * static_cast<float>(dot) - dmin * sm.min * sc[j].s;
    }
    return sum;
  }
  static void dequantize(const Block& b, float* w) { Dequantize(b, w); }
};
using Q4_KFormat = KFormat<BlockQ4_K, q4_k_value, dequantize_block_q4_k>;
using Q5_KFormat = KFormat<BlockQ5_K, q5_k_value, dequantize_block_q5_k>;

// Q6_K: activation block j (32 values) spans two 16-value scale groups:
// d dx_j (scales[2j] dot(q - 32, qx)[0..16) + scales[2j+1] dot(q - 32, qx)[16..32)).
struct Q6_KFormat {
  using Block = BlockQ6_K;
  static constexpr int kValues = kQK_K;
  static float q8_block(const Block& b, const int8_t* qx, const Q8ActScale* sc) {
    const float d = fp16_to_f32(b.d);
    float sum = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t scaled = 0;
      for (int g = 2 * j; g < 2 * j + 2; ++g) {
        int32_t dot = 0;
        for (int l = 16 * g; l < 16 * g + 16; ++l) dot += (q6_k_value(b, l) - 32) * qx[l];
        scaled += b.scales[g] * dot;
      }
      sum += d * sc[j].d * static_cast<float>(scaled);
    }
    return sum;
  }
  static void dequantize(const Block& b, float* w) { dequantize_block_q6_k(b, w); }
};

template <typename Format>
struct Q8RowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    constexpr int kSubBlocks = Format::kValues / 32;
    const int64_t n_blocks = job.cols / Format::kValues;
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = job.w + (first_row + r * row_step) * job.row_bytes;
      const auto* blocks = reinterpret_cast<const typename Format::Block*>(row);
      for (int i = 0; i < N; ++i) {
        const Q8ActRow a = q8_act_row(job, first_token + i);
        float acc = 0;
        for (int64_t b = 0; b < n_blocks; ++b)
          acc += Format::q8_block(blocks[b], a.qs + b * Format::kValues, a.scales + b * kSubBlocks);
        out[r * N + i] = acc;
      }
    }
  }
};

template <typename Format>
struct ExactRowDot {
  template <int R, int N>
  static void dot(const MatmulJob& job, int64_t first_row, int64_t row_step, int64_t first_token, float* out) {
    const int64_t n_blocks = job.cols / Format::kValues;
    float w[Format::kValues];
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = job.w + (first_row + r * row_step) * job.row_bytes;
      const auto* blocks = reinterpret_cast<const typename Format::Block*>(row);
      float acc[N] = {};
      for (int64_t b = 0; b < n_blocks; ++b) {
        Format::dequantize(blocks[b], w);
        for (int i = 0; i < N; ++i) {
          const float* x = job.x + (first_token + i) * job.cols + b * Format::kValues;
          for (int j = 0; j < Format::kValues; ++j) acc[i] += w[j] * x[j];
        }
      }
      for (int i = 0; i < N; ++i) out[r * N + i] = acc[i];
    }
  }
};

template <typename Format>
constexpr QuantKernels kernels_for() {
  return {run_row_tiles<Q8RowDot<Format>>, run_row_tiles<ExactRowDot<Format>>};
}

constexpr KQuantKernels kScalarKQuants = {
    kernels_for<Q5_0Format>(),
    kernels_for<Q5_1Format>(),
    kernels_for<IQ4_NLFormat>(),
    kernels_for<IQ4_XSFormat>(),
    kernels_for<Q2_KFormat>(),
    kernels_for<Q3_KFormat>(),
    kernels_for<Q4_KFormat>(),
    kernels_for<Q5_KFormat>(),
    kernels_for<Q6_KFormat>(),
};

}  // namespace

const KQuantKernels& scalar_kquant_kernels() { return kScalarKQuants; }

}  // namespace kvserve
