#pragma once
// Rotary position embedding with its per-pair frequencies computed once (at
// model load) and each position's cos / sin once per forward step, shared by
// every layer and by Q and K. Scaling schemes that only change frequencies
// fold into them: Llama 3's per-pair factors (GGUF `rope_freqs.weight`: the
// pair's angle is divided by its factor, as llama.cpp's ggml_rope_ext does)
// and linear position scaling (`rope.scaling.type` linear: positions divided
// by `rope.scaling.factor`), and YaRN (`rope.scaling.type` yarn: each pair's
// angle a blend of the interpolated and the original one, by a ramp over the
// pairs whose wavelength fits the original context, with cos / sin scaled by
// a magnitude), as ggml's rope_yarn computes them. kernels/ops.h's rope() is
// the plain reference.
#include <cstdint>
#include <vector>

namespace kvserve {

// YaRN's constants (ggml_rope_ext's ext_factor, n_ctx_orig, beta_fast, beta_slow).
struct RopeYarn {
  double ext_factor = 0.0;        // 0: no YaRN blend (plain or linear scaling)
  int64_t original_context = 0;   // the context the model was trained at
  double beta_fast = 32.0;
  double beta_slow = 1.0;
};

struct RopeParams {
  int64_t rot_dims = 0;  // leading dims of each head that are rotated (even)
  double theta = 10000.0;
  bool neox = false;                // pairs (i, i + rot/2) instead of (2i, 2i + 1)
  std::vector<float> freq_factors;  // empty, or rot_dims / 2 divisors of each pair's angle
  double position_scale = 1.0;      // positions are multiplied by this (1 / linear or YaRN factor)
  RopeYarn yarn = {};
  double magnitude = 1.0;           // cos and sin are multiplied by this (YaRN's mscale, rope.scaling.attn_factor)
};

// Pair i's multiplier of its interpolated angle under YaRN: 1 - ramp + ramp /
// position_scale, ramp = 1 for the high-frequency pairs (kept as trained), 0
// for the low ones (interpolated); ggml_rope_yarn_corr_dims' boundaries.
std::vector<double> yarn_pair_multipliers(const RopeParams& p);

class RopeTable {
 public:
  explicit RopeTable(const RopeParams& params);

  int64_t rot_dims() const { return rot_dims_; }
  // cs[2i], cs[2i + 1] = cos, sin of pair i's angle at pos (rot_dims floats).
  void angles(int64_t pos, float* cs) const;
  // Rotates n_heads heads of head_dim values in place by angles() output.
  void apply(float* x, int64_t n_heads, int64_t head_dim, const float* cs) const;

 private:
  std::vector<double> inv_freq_;
  int64_t rot_dims_;
  float magnitude_;
  bool neox_;
};

}  // namespace kvserve
