#pragma once
// The stage the pipeline messages fuzz target decodes for, and its seeds
// (tests/fuzz/write_seeds.cpp) are encoded for.
#include "parallel/pipeline_messages.h"

namespace kvserve::pipeline_fuzz {

inline constexpr StepLimits kSeedLimits{.dim = 8, .n_blocks = 16, .block_size = 4};
inline constexpr size_t kSeedLogits = 6;  // a reply's floats

}  // namespace kvserve::pipeline_fuzz
