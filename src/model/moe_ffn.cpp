// Transformer::moe_ffn_block: a mixture-of-experts FFN (qwen2moe, qwen3moe, deepseek).
// The router picks each token's experts; the batch's rows are then grouped
// by expert so that every chosen expert's three matrices are read once per
// step for all its tokens (prefill and continuous batching), all experts'
// products in two parallel regions (gate and up, then down), and each row's
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

void Transformer::run_expert(const ExpertWeights& e, const float* x, int64_t m, float* out) {
  const MatmulProduct gate_up[] = {{&e.gate, gate_.data()}, {&e.up, up_.data()}};
  matmul_shared_input(gate_up, x, m);
  silu_mul(gate_.data(), up_.data(), m * e.gate.rows());
  matmul(e.down, gate_.data(), m, out);
}

void Transformer::run_experts(const LayerWeights& w) {
  const int64_t E = cfg_.n_experts, ff = cfg_.expert_ffn_dim, dim = cfg_.dim;
  const auto add_tasks = [&](auto&& task_of) {
    expert_tasks_.clear();
    for (int64_t e = 0; e < E; ++e)
      if (const int64_t m = groups_.count(e); m > 0)
        task_of(w.experts[static_cast<size_t>(e)], groups_.offsets[static_cast<size_t>(e)], m);
    matmul_tasks(expert_tasks_);
  };
  add_tasks([&](const ExpertWeights& x, int64_t first, int64_t m) {
    expert_tasks_.push_back({&x.gate, expert_x_.data() + first * dim, m, gate_.data() + first * ff});
    expert_tasks_.push_back({&x.up, expert_x_.data() + first * dim, m, up_.data() + first * ff});
  });
  silu_mul(gate_.data(), up_.data(), groups_.offsets.back() * ff);
  add_tasks([&](const ExpertWeights& x, int64_t first, int64_t m) {
    expert_tasks_.push_back({&x.down, gate_.data() + first * ff, m, expert_y_.data() + first * dim});
  });
}

void Transformer::moe_ffn_block(int64_t layer, int64_t n) {
  const LayerWeights& w = model_.weights().layers[static_cast<size_t>(layer)];
  const int64_t dim = cfg_.dim, E = cfg_.n_experts, k = cfg_.n_experts_used;
  rmsnorm_rows(x_.data(), w.ffn_norm.data(), n, dim, cfg_.norm_eps, xn_.data());
  router_logits_.resize(static_cast<size_t>(n * E));
  matmul(w.router, xn_.data(), n, router_logits_.data());
  choices_.resize(static_cast<size_t>(n * k));
  RouterOptions router{E, k, cfg_.expert_gating_sigmoid, cfg_.expert_weights_norm, w.expert_bias, cfg_.expert_groups,
                       cfg_.expert_groups_used};
  route_tokens(router_logits_.data(), n, router, choices_);
  if (cfg_.expert_weights_scale != 1.0)
    for (ExpertChoice& c : choices_) c.weight *= static_cast<float>(cfg_.expert_weights_scale);
  std::memset(proj_.data(), 0, static_cast<size_t>(n * dim) * sizeof(float));
  if (group_experts_) {
    group_by_expert(choices_, k, E, groups_);
    const int64_t rows = n * k;
    // Slot s of the expert-major order holds batch row groups_.rows[s]; each
    // row's slots, listed in that order, come in expert-id order.
    row_slots_.assign(static_cast<size_t>(rows), 0);
    std::vector<int64_t>& filled = row_slot_counts_;
    filled.assign(static_cast<size_t>(n), 0);
    for (int64_t slot = 0; slot < rows; ++slot) {
      const int64_t row = groups_.rows[static_cast<size_t>(slot)];
      row_slots_[static_cast<size_t>(row * k + filled[static_cast<size_t>(row)]++)] = slot;
    }
#pragma omp parallel for schedule(static) if (rows * dim >= kOpsParallelElements)
    for (int64_t slot = 0; slot < rows; ++slot)
      std::memcpy(expert_x_.data() + slot * dim, xn_.data() + groups_.rows[static_cast<size_t>(slot)] * dim,
                  static_cast<size_t>(dim) * sizeof(float));
    run_experts(w);
#pragma omp parallel for schedule(static) if (rows * dim >= kOpsParallelElements)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const auto slot = static_cast<size_t>(row_slots_[static_cast<size_t>(t * k + i)]);
        add_scaled(proj_.data() + t * dim, expert_y_.data() + static_cast<int64_t>(slot) * dim, groups_.weights[slot], dim);
      }
  } else {  // the A/B baseline: every token's experts alone, weights read once per token
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const ExpertChoice& c = choices_[static_cast<size_t>(t * k + i)];
        run_expert(w.experts[static_cast<size_t>(c.expert)], xn_.data() + t * dim, 1, expert_y_.data());
        add_scaled(proj_.data() + t * dim, expert_y_.data(), c.weight, dim);
      }
  }
  if (w.shared_gate.data != nullptr) {  // + the shared FFN(x): qwen2moe's times sigmoid(g . x), deepseek's as is
    run_expert({w.shared_gate, w.shared_up, w.shared_down}, xn_.data(), n, expert_y_.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = xn_.data() + t * dim;
      float g = 1.0f;
      if (!w.shared_gate_inp.empty()) {
        float dot = 0;
        for (int64_t i = 0; i < dim; ++i) dot += w.shared_gate_inp[static_cast<size_t>(i)] * xt[i];
        g = 1.0f / (1.0f + std::exp(-dot));
      }
      add_scaled(proj_.data() + t * dim, expert_y_.data() + t * dim, g, dim);
    }
  }
  add_residual(w.ffn_post_norm, n);
}

}  // namespace kvserve
