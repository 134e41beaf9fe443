// The packed float GEMM (kernels/float_gemm_simd.h) compiled for the AVX-512
// table: the same 256-bit code (Zen 4 runs 512-bit FMAs as two halves, and
// the layout is 8 rows per register) with 32 registers, so a prefill
// micro-tile is 4 row groups x 6 tokens (24 accumulators).
#include "kernels/float_gemm_simd.h"

namespace kvserve {

const FloatPackedKernels& avx512_float_packed_kernels() {
  static const FloatPackedKernels table = float_gemm::make_float_packed_kernels<32, 8, 6>();
  return table;
}

}  // namespace kvserve
