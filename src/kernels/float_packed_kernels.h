#pragma once
// Internal to src/kernels: the GEMM kernels over float weights repacked by
// repack_float_rows8() (kernels/float_packed.h), one table per instruction set.
// They take a PackedJob (kernels/packed_kernels.h) whose xq is the f32
// activations themselves: n_tokens rows of cols floats, xq_row_bytes apart.
#include "core/dtype.h"
#include "kernels/packed_kernels.h"

namespace kvserve {

struct FloatPackedKernels {
  PackedRowsFn f32, f16, bf16;
};

#if KVSERVE_HAVE_SIMD
const FloatPackedKernels& avx2_float_packed_kernels();
const FloatPackedKernels& avx512_float_packed_kernels();
#endif
// The active ISA's table, or nullptr where it has none (scalar).
const FloatPackedKernels* active_float_packed_kernels();
// The kernel for one type from a table (nullptr for a non-float type).
PackedRowsFn float_packed_kernel_for(const FloatPackedKernels& table, DType type);

}  // namespace kvserve
