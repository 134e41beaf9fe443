// Transformer::moe_ffn_block: a mixture-of-experts FFN (qwen2moe, qwen3moe).
// The router picks each token's experts; the batch's rows are then grouped
// by expert so that every chosen expert's three matrices are read once per
// step for all its tokens (prefill and continuous batching), and each row's
// weighted expert outputs are summed in expert-id order: a token's result
// does not depend on which other tokens share its step.
#include <cmath>
#include <cstring>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/transformer.h"

namespace kvserve {
namespace {

// y[i] += a * x[i]
void add_scaled(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void Transformer::run_expert(const ExpertWeights& e, int64_t m, float* out) {
  const MatmulProduct gate_up[] = {{&e.gate, gate_.data()}, {&e.up, up_.data()}};
  matmul_shared_input(gate_up, expert_x_.data(), m);
  silu_mul(gate_.data(), up_.data(), m * e.gate.rows());
  matmul(e.down, gate_.data(), m, out);
}

void Transformer::moe_ffn_block(int64_t layer, int64_t n) {
  const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
  const int64_t dim = cfg_.dim, E = cfg_.n_experts, k = cfg_.n_experts_used;
  rmsnorm_rows(x_.data(), w.ffn_norm.data(), n, dim, cfg_.norm_eps, xn_.data());
  router_logits_.resize(static_cast<size_t>(n * E));
  matmul(w.router, xn_.data(), n, router_logits_.data());
  choices_.resize(static_cast<size_t>(n * k));
  route_tokens(router_logits_.data(), n, E, k, cfg_.expert_weights_norm, choices_);
  std::memset(proj_.data(), 0, static_cast<size_t>(n * dim) * sizeof(float));
  if (!group_experts_) {  // the A/B baseline: every token's experts alone, weights read once per token
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const ExpertChoice& c = choices_[static_cast<size_t>(t * k + i)];
        std::memcpy(expert_x_.data(), xn_.data() + t * dim, static_cast<size_t>(dim) * sizeof(float));
        run_expert(w.experts[static_cast<size_t>(c.expert)], 1, expert_y_.data());
        add_scaled(proj_.data() + t * dim, expert_y_.data(), c.weight, dim);
      }
  }
  if (group_experts_) group_by_expert(choices_, k, E, groups_);
  for (int64_t e = 0; group_experts_ && e < E; ++e) {
    const int64_t m = groups_.count(e);
    if (m == 0) continue;
    const int64_t first = groups_.offsets[static_cast<size_t>(e)];
    // An expert's rows are distinct batch rows: gather and scatter split over the threads.
#pragma omp parallel for schedule(static) if (m * dim >= kOpsParallelElements)
    for (int64_t j = 0; j < m; ++j)
      std::memcpy(expert_x_.data() + j * dim, xn_.data() + groups_.rows[static_cast<size_t>(first + j)] * dim,
                  static_cast<size_t>(dim) * sizeof(float));
    run_expert(w.experts[static_cast<size_t>(e)], m, expert_y_.data());
#pragma omp parallel for schedule(static) if (m * dim >= kOpsParallelElements)
    for (int64_t j = 0; j < m; ++j) {
      const auto slot = static_cast<size_t>(first + j);
      add_scaled(proj_.data() + groups_.rows[slot] * dim, expert_y_.data() + j * dim, groups_.weights[slot], dim);
    }
  }
  if (!w.shared_gate_inp.empty()) {  // qwen2moe: + sigmoid(g . x) * shared FFN(x)
    std::memcpy(expert_x_.data(), xn_.data(), static_cast<size_t>(n * dim) * sizeof(float));
    run_expert({w.shared_gate, w.shared_up, w.shared_down}, n, expert_y_.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = xn_.data() + t * dim;
      float g = 0;
      for (int64_t i = 0; i < dim; ++i) g += w.shared_gate_inp[static_cast<size_t>(i)] * xt[i];
      add_scaled(proj_.data() + t * dim, expert_y_.data() + t * dim, 1.0f / (1.0f + std::exp(-g)), dim);
    }
  }
  add_residual(w.ffn_post_norm, n);
}

}  // namespace kvserve
