// The golden table of kernels/det_math.h checked by code compiled for each CPU path
// (tests/det_golden_check.cpp, built once per path under these names).
#pragma once
#include <cstdint>
#include <string>

enum class DetFn : int { Exp, Log, Cos, PowInt };

struct DetGoldenResult {
  int checked = 0;
  int mismatches = 0;
  std::string report;  // one line per mismatch
};

DetGoldenResult det_golden_check_portable();
#if defined(__x86_64__)
DetGoldenResult det_golden_check_avx2();    // compiled with -mavx2 -mfma: call only where the CPU has them
DetGoldenResult det_golden_check_avx512();  // compiled with AVX-512F/DQ/BW/VL and FMA
#endif
