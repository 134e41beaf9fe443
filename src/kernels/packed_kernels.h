#pragma once
// Internal to src/kernels: the 8-bit-activation kernels over weights repacked
// by repack_rows8() (kernels/repack.h), one table per instruction set.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/dispatch.h"

namespace kvserve {

struct PackedJob {
  const uint8_t* w = nullptr;  // packed row groups, group_bytes apart
  size_t group_bytes = 0;
  int64_t cols = 0;
  int64_t rows = 0;             // unpadded
  int64_t n_tokens = 0;
  const uint8_t* xq = nullptr;  // n_tokens rows of packed_act_row_bytes(type, cols)
  size_t xq_row_bytes = 0;
  float* y = nullptr;           // n_tokens x rows
};

// Computes row groups [group_begin, group_end) (rows 8 group_begin ..) for all tokens.
using PackedRowsFn = void (*)(const PackedJob& job, int64_t group_begin, int64_t group_end);

struct PackedKernels {
  PackedRowsFn q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k;
};

#if KVSERVE_HAVE_SIMD
const PackedKernels& avx2_packed_kernels();
const PackedKernels& avx512_packed_kernels();
#endif
// The active ISA's table, or nullptr where it has none (scalar): then weights
// are not repacked.
const PackedKernels* active_packed_kernels();
// The kernel for one type from a table (nullptr for a type it does not take).
PackedRowsFn packed_kernel_for(const PackedKernels& table, DType type);

}  // namespace kvserve
