// The packed 8-bit-activation kernels (kernels/packed_simd.h) compiled for the
// AVX-512 table: the same 256-bit code, with 32 registers for 8 tokens a call.
#include "kernels/packed_simd.h"

namespace kvserve {

const PackedKernels& avx512_packed_kernels() {
  static const PackedKernels table = packed_simd::make_packed_kernels<8>();
  return table;
}

}  // namespace kvserve
