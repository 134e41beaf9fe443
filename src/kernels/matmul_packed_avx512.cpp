// The packed 8-bit-activation kernels (kernels/packed_simd.h) compiled for the
// AVX-512 table: two 8-row groups per 512-bit register, 32 registers for 8
// tokens a call.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized (see matmul_avx512.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/packed_simd.h"

namespace kvserve {

const PackedKernels& avx512_packed_kernels() {
  static const PackedKernels table = packed_simd::make_packed_kernels<packed_simd::Zmm, 8>();
  return table;
}

}  // namespace kvserve
