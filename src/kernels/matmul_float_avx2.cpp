// The packed float GEMM (kernels/float_gemm_simd.h) with AVX2 + FMA + F16C:
// 16 registers, so a prefill micro-tile is 2 row groups x 6 tokens (12
// accumulators); decode takes 4 groups per call.
#include "kernels/float_gemm_simd.h"

namespace kvserve {

const FloatPackedKernels& avx2_float_packed_kernels() {
  static const FloatPackedKernels table = float_gemm::make_float_packed_kernels<16, 4, 4>();
  return table;
}

}  // namespace kvserve
