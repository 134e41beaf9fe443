#pragma once
// Rotary position embedding with its per-pair frequencies computed once (at
// model load) and each position's cos / sin once per forward step, shared by
// every layer and by Q and K. Scaling schemes that only change frequencies
// fold into them: Llama 3's per-pair factors (GGUF `rope_freqs.weight`: the
// pair's angle is divided by its factor, as llama.cpp's ggml_rope_ext does)
// and linear position scaling (`rope.scaling.type` linear: positions divided
// by `rope.scaling.factor`). kernels/ops.h's rope() is the plain reference.
#include <cstdint>
#include <vector>

namespace kvserve {

struct RopeParams {
  int64_t rot_dims = 0;  // leading dims of each head that are rotated (even)
  double theta = 10000.0;
  bool neox = false;                // pairs (i, i + rot/2) instead of (2i, 2i + 1)
  std::vector<float> freq_factors;  // empty, or rot_dims / 2 divisors of each pair's angle
  double position_scale = 1.0;      // positions are multiplied by this (1 / linear factor)
};

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
  bool neox_;
};

}  // namespace kvserve
