// The golden table of kernels/det_math.h (tests/data/det_golden.inc, written by
// tools/det_golden.py) and its checker, compiled for each CPU path
// (tests/det_golden_check.cpp, built once per path under the names below).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

enum class DetFn : int { Exp, Log, Cos, PowInt };

// One input and the output bits it must give, with the error of those against the
// exact value (mpmath; -1: a special value, exact).
struct DetGoldenEntry {
  DetFn fn;
  uint64_t input;
  long long n;  // pow_int's exponent
  uint64_t output;
  double error_ulps;
};

// `count` inputs drawn from a fixed xorshift stream, pinned by one FNV-1a hash of the
// outputs' bits: a change that moves one result in a million shows. Uniform: x uniform in
// [lo, hi). Binades: x = m 2^e, m uniform in [0.5, 1), e uniform in [lo, hi). pow_int:
// base uniform in [lo, hi), n = the next draw mod `n_max`.
enum class DetDraw : int { Uniform, Binades };
struct DetGoldenStream {
  DetFn fn;
  DetDraw draw;
  double lo, hi;
  long long n_max;
  long long count;
  uint64_t seed;
  uint64_t hash;
};

struct DetStreamState {
  uint64_t x;
  uint64_t next() {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(next() >> 11) / 9007199254740992.0); }
};

// The hash of `s`'s outputs under `f(fn, x, n)` (a NaN hashed as one canonical NaN).
template <class F>
uint64_t det_stream_hash(const DetGoldenStream& s, F f) {
  DetStreamState st{s.seed};
  uint64_t h = 0xcbf29ce484222325ull;
  for (long long i = 0; i < s.count; ++i) {
    double x;
    long long n = 0;
    if (s.draw == DetDraw::Binades) {
      const double m = st.uniform(0.5, 1.0);
      x = std::ldexp(m, static_cast<int>(std::floor(st.uniform(s.lo, s.hi))));
    } else {
      x = st.uniform(s.lo, s.hi);
    }
    if (s.fn == DetFn::PowInt) n = static_cast<long long>(st.next() % static_cast<uint64_t>(s.n_max));
    double y = f(s.fn, x, n);
    if (std::isnan(y)) y = std::nan("");
    uint64_t b;
    std::memcpy(&b, &y, 8);
    for (int k = 0; k < 8; ++k) h = (h ^ ((b >> (8 * k)) & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

struct DetGoldenResult {
  int checked = 0;  // table entries
  int streams = 0;  // hashed streams
  int mismatches = 0;
  std::string report;  // one line per mismatch
};

DetGoldenResult det_golden_check_portable();
#if defined(__x86_64__)
DetGoldenResult det_golden_check_avx2();    // compiled with -mavx2 -mfma: call only where the CPU has them
DetGoldenResult det_golden_check_avx512();  // compiled with AVX-512F/DQ/BW/VL and FMA
#endif
