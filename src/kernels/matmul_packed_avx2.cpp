// The packed 8-bit-activation kernels (kernels/packed_simd.h) with AVX2: 16
// registers hold 4 tokens' s16 and s32 sums beside the unpacked weights.
#include "kernels/packed_simd.h"

namespace kvserve {

const PackedKernels& avx2_packed_kernels() {
  static const PackedKernels table = packed_simd::make_packed_kernels<packed_simd::Ymm, 4>();
  return table;
}

}  // namespace kvserve
