// The packed 8-bit-activation kernels (kernels/packed_simd.h) compiled for the
// AVX-512 table: for several tokens, two 8-row groups per 512-bit register and
// 32 registers for 8 tokens a call; one token in 256-bit registers.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (see matmul_avx512.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/packed_simd.h"

namespace kvserve {

const PackedKernels& avx512_packed_kernels() {
  static const PackedKernels table = packed_simd::make_wide_packed_kernels<8>();
  return table;
}

}  // namespace kvserve
