// Multi-head latent attention (deepseek2, llama.cpp's deepseek2 graph): the
// projections around the attention kernels. A token's cache row is
// [rmsnorm(c) | RoPE(k_pe)] (kv_lora_rank + rope_dims values, one "KV head");
// each query head is absorbed into the same space, q = [W_UK_h^T q_nope_h |
// RoPE(q_pe_h)], so attention is MQA over the cached rows, V being their first
// kv_lora_rank values; a head's output goes through W_UV_h to v_head_dim
// values and then through attn_output. Keys and values are never
// decompressed per token. attend_decompressed() is the textbook form (each
// head's K and V rebuilt from the latent rows), kept as the reference that
// the absorbed form is tested and benchmarked against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "model/transformer.h"

namespace kvserve {

void Transformer::resize_mla_scratch(int64_t n) {
  const auto N = static_cast<size_t>(n), H = static_cast<size_t>(cfg_.n_heads);
  const auto widest = static_cast<size_t>(std::max({cfg_.qk_nope_dim, cfg_.kv_lora_rank, cfg_.v_head_dim}));
  mla_q_.resize(N * H * static_cast<size_t>(cfg_.mla_key_dim()));
  mla_qa_.resize(N * static_cast<size_t>(std::max<int64_t>(cfg_.q_lora_rank, 1)));
  mla_in_.resize(H * N * widest);
  mla_out_.resize(H * N * widest);
  mla_v_.resize(N * H * static_cast<size_t>(cfg_.v_head_dim));
}

void Transformer::project_mla(const LayerWeights& w, int64_t n) {
  const int64_t dim = cfg_.dim, H = cfg_.n_heads, kq = cfg_.mla_key_dim(), rank = cfg_.kv_lora_rank;
  const int64_t row = cfg_.kv_dim(), rot = cfg_.rope_dims;
  rmsnorm_rows(x_.data(), w.attn_norm.data(), n, dim, cfg_.norm_eps, xn_.data());
  if (cfg_.q_lora_rank > 0) {
    const MatmulProduct a[] = {{&w.wq_a, mla_qa_.data()}, {&w.wkv_a, k_.data()}};
    matmul_shared_input(a, xn_.data(), n);
    rmsnorm_rows(mla_qa_.data(), w.q_a_norm.data(), n, cfg_.q_lora_rank, cfg_.norm_eps, mla_qa_.data());
    matmul(w.wq_b, mla_qa_.data(), n, mla_q_.data());
  } else {
    const MatmulProduct a[] = {{&w.wq, mla_q_.data()}, {&w.wkv_a, k_.data()}};
    matmul_shared_input(a, xn_.data(), n);
  }
  // The cache rows: the latent normalized, the RoPE key rotated (one head of rot values).
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t t = 0; t < n; ++t) {
    float* k = k_.data() + t * row;
    const float* cs = rope_angles_.data() + t * rot;
    rmsnorm(k, w.kv_a_norm.data(), rank, cfg_.norm_eps, k);
    rope_.apply(k + rank, 1, rot, cs);
    rope_.apply(mla_q_.data() + t * H * kq + cfg_.qk_nope_dim, H, kq, cs);  // each head's q_pe
  }
  absorb_queries(w, n);
}

void Transformer::per_head_products(const std::vector<TensorView>& w, const float* in, int64_t in_row,
                                    int64_t in_head, int64_t n, float* out, int64_t out_row, int64_t out_head) {
  const auto H = static_cast<int64_t>(w.size());
  const int64_t cols = w[0].cols(), rows = w[0].rows();
  // Head-major copies, so that every head's product is one matmul over its n rows.
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(mla_in_.data() + (h * n + t) * cols, in + t * in_row + h * in_head,
                  static_cast<size_t>(cols) * sizeof(float));
  mla_tasks_.clear();
  for (int64_t h = 0; h < H; ++h)
    mla_tasks_.push_back({&w[static_cast<size_t>(h)], mla_in_.data() + h * n * cols, n, mla_out_.data() + h * n * rows});
  matmul_tasks(mla_tasks_);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(out + t * out_row + h * out_head, mla_out_.data() + (h * n + t) * rows,
                  static_cast<size_t>(rows) * sizeof(float));
}

void Transformer::absorb_queries(const LayerWeights& w, int64_t n) {
  const int64_t H = cfg_.n_heads, kq = cfg_.mla_key_dim(), nope = cfg_.qk_nope_dim, rank = cfg_.kv_lora_rank;
  const int64_t hd = cfg_.head_dim;
  // q_ per head: [W_UK^T q_nope | RoPE(q_pe)].
  per_head_products(w.wk_b, mla_q_.data(), H * kq, kq, n, q_.data(), H * hd, hd);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(q_.data() + (t * H + h) * hd + rank, mla_q_.data() + t * H * kq + h * kq + nope,
                  static_cast<size_t>(cfg_.rope_dims) * sizeof(float));
}

void Transformer::mla_values(const LayerWeights& w, int64_t n) {
  const int64_t H = cfg_.n_heads, hd = cfg_.head_dim, vd = cfg_.v_head_dim;
  // attn_ holds each head's weighted sum of cache rows; W_UV_h reads its first kv_lora_rank values.
  per_head_products(w.wv_b, attn_.data(), H * hd, hd, n, mla_v_.data(), H * vd, vd);
}

void Transformer::project_attention(const LayerWeights& w, int64_t n) {
  if (!cfg_.is_mla()) return project_qkv(w, n);
  resize_mla_scratch(n);
  project_mla(w, n);
}

void Transformer::attention_output(const LayerWeights& w, int64_t n, bool values_ready) {
  if (!cfg_.is_mla()) return matmul(w.wo, attn_.data(), n, proj_.data());
  if (!values_ready) mla_values(w, n);
  matmul(w.wo, mla_v_.data(), n, proj_.data());
}

namespace {

// A head's W_UK as a [qk_nope_dim rows][kv_lora_rank cols] f32 matrix (the
// transpose of attn_k_b's slice), so that k_nope = W_UK c is one matmul.
void transposed_f32(const TensorView& t, std::vector<float>& out) {
  const int64_t rows = t.rows(), cols = t.cols();
  std::vector<float> row(static_cast<size_t>(cols));
  out.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type, t.row(r), row.data(), cols);
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = row[static_cast<size_t>(c)];
  }
}

TensorView f32_matrix(const std::vector<float>& data, int64_t rows, int64_t cols) {
  TensorView v;
  v.name = "mla decompression";
  v.type = DType::F32;
  v.n_dims = 2;
  v.ne = {cols, rows, 1, 1};
  v.data = reinterpret_cast<const uint8_t*>(data.data());
  v.nbytes = data.size() * sizeof(float);
  return v;
}

}  // namespace

void Transformer::attend_decompressed(int64_t layer, int64_t n, int64_t pos0, const ContiguousKVCache& cache) {
  const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
  const int64_t H = cfg_.n_heads, kq = cfg_.mla_key_dim(), nope = cfg_.qk_nope_dim, rank = cfg_.kv_lora_rank;
  const int64_t rot = cfg_.rope_dims, vd = cfg_.v_head_dim, row = cfg_.kv_dim(), n_kv = pos0 + n;
  const float scale = cfg_.attention_scale;
  // Every cached row as f32 [n_kv][rank + rot], then its latent part alone.
  reference_k_.resize(static_cast<size_t>(n_kv * row));
  dequantize_kv_rows(cache.k_rows(layer), n_kv, 1, row, reference_k_.data());
  // A quantized cache holds the rows rotated (choose_kv_rotation): turned back, they are the rows as projected.
  if (kv_rotation_.keys > 0) hadamard_rotate(reference_k_.data(), n_kv * row, kv_rotation_.keys);
  std::vector<float> latent(static_cast<size_t>(n_kv * rank)), k_nope(static_cast<size_t>(n_kv * nope));
  std::vector<float> values(static_cast<size_t>(n_kv * vd)), w_uk, scores(static_cast<size_t>(n_kv));
  for (int64_t j = 0; j < n_kv; ++j)
    std::memcpy(latent.data() + j * rank, reference_k_.data() + j * row, static_cast<size_t>(rank) * sizeof(float));
  for (int64_t h = 0; h < H; ++h) {
    transposed_f32(w.wk_b[static_cast<size_t>(h)], w_uk);
    const TensorView uk = f32_matrix(w_uk, nope, rank);
    matmul(uk, latent.data(), n_kv, k_nope.data());                          // [n_kv][nope]
    matmul(w.wv_b[static_cast<size_t>(h)], latent.data(), n_kv, values.data());  // [n_kv][vd]
    for (int64_t t = 0; t < n; ++t) {
      const float* q = mla_q_.data() + t * H * kq + h * kq;  // [q_nope | RoPE(q_pe)]
      const int64_t seen = pos0 + t + 1;
      float max = -INFINITY;
      for (int64_t j = 0; j < seen; ++j) {
        float s = 0;
        for (int64_t i = 0; i < nope; ++i) s += q[i] * k_nope[static_cast<size_t>(j * nope + i)];
        for (int64_t i = 0; i < rot; ++i) s += q[nope + i] * reference_k_[static_cast<size_t>(j * row + rank + i)];
        scores[static_cast<size_t>(j)] = s * scale;
        max = std::max(max, scores[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j < seen; ++j) sum += scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - max);
      float* out = mla_v_.data() + (t * H + h) * vd;
      std::fill(out, out + vd, 0.0f);
      for (int64_t j = 0; j < seen; ++j) {
        const auto p = static_cast<float>(scores[static_cast<size_t>(j)] / sum);
        for (int64_t i = 0; i < vd; ++i) out[i] += p * values[static_cast<size_t>(j * vd + i)];
      }
    }
  }
}

}  // namespace kvserve
