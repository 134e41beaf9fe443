#pragma once
// Element-wise and row-wise transformer ops (scalar but for the gated activations;
// memory-light next to matmul). The gated activations, add_inplace and rmsnorm_rows split long inputs (a batch)
// over the OpenMP threads; results do not depend on the split.
#include <cstdint>

namespace kvserve {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]; out may alias x.
void rmsnorm(const float* x, const float* weight, int64_t n, float eps, float* out);
// rmsnorm of `rows` consecutive rows of `dim` values.
void rmsnorm_rows(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

// Rotates `n_heads` heads of size head_dim in place for position pos.
// neox = false: pairs (x[2i], x[2i+1]) (llama / GPT-J layout);
// neox = true:  pairs (x[i], x[i + head_dim/2]) (qwen2 / GPT-NeoX layout).
// Only the first rot_dims dimensions of each head are rotated.
void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rot_dims, int64_t pos, float theta, bool neox);

// The element count from which the element-wise ops (here and in
// activations_avx2.cpp) split over the OpenMP threads.
constexpr int64_t kOpsParallelElements = 16384;

// gate[i] = silu(gate[i]) * up[i]; SIMD and scalar (libm expf) as gelu_tanh_mul below.
void silu_mul(float* gate, const float* up, int64_t n);
void silu_mul_scalar(float* gate, const float* up, int64_t n);
#if KVSERVE_HAVE_SIMD
void silu_mul_avx2(float* gate, const float* up, int64_t n);
#endif

// gate[i] = gelu(gate[i]) * up[i], GELU's tanh approximation (Gemma's gelu_pytorch_tanh).
// With SIMD kernels active: gelu_tanh_mul_avx2, else the scalar loop (libm tanh),
// its reference (they agree to ~1e-6 relative; each is element-wise, so a value's
// result does not depend on n or its position).
void gelu_tanh_mul(float* gate, const float* up, int64_t n);
void gelu_tanh_mul_scalar(float* gate, const float* up, int64_t n);
#if KVSERVE_HAVE_SIMD
void gelu_tanh_mul_avx2(float* gate, const float* up, int64_t n);
#endif

// x[i] = cap * tanh(x[i] / cap) (Gemma's logit soft-capping)
void softcap(float* x, int64_t n, float cap);

// x[i] *= s
void scale_inplace(float* x, int64_t n, float s);

// x[i] = exp(x[i] - max) / sum, in place; -inf entries become 0.
void softmax(float* x, int64_t n);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);

}  // namespace kvserve
