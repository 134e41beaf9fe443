#pragma once
// What the CPU we run on can execute, read once with CPUID/XGETBV. A feature
// counts only when the OS also saves its register state (XCR0), since an
// instruction the CPU has but the OS does not context-switch would corrupt
// registers across thread switches.
namespace kvserve {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
};

// Detected on first call; later calls return the same object.
const CpuFeatures& cpu_features();

}  // namespace kvserve
