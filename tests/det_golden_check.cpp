// The golden table of the engine's own transcendentals (tests/data/det_golden.inc,
// written by tools/det_golden.py), checked bit for bit. This file is compiled once per
// CPU path (tests/CMakeLists.txt: portable, and on x86-64 with AVX2+FMA and with
// AVX-512 enabled), each copy under its own function name, so that a compiler that
// contracted or reordered det::'s arithmetic for one instruction set shows here.
// `flatten` inlines det::exp & co. into the checker, compiled with this file's flags
// (an out-of-line copy of an inline function may come from any object file).
#include "det_golden.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "kernels/det_math.h"

namespace det = engine::kernels::det;

namespace {

#include "data/det_golden.inc"  // kDetGolden[], kDetGoldenStreams[]

double from_bits(uint64_t b) {
  double x;
  std::memcpy(&x, &b, 8);
  return x;
}
uint64_t to_bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return b;
}

}  // namespace

__attribute__((flatten)) DetGoldenResult DET_GOLDEN_CHECK() {
  DetGoldenResult r;
  std::ostringstream report;
  for (const DetGoldenEntry& e : kDetGolden) {
    const double x = from_bits(e.input);
    double y = 0;
    switch (e.fn) {
      case DetFn::Exp: y = det::exp(x); break;
      case DetFn::Log: y = det::log(x); break;
      case DetFn::Cos: y = det::cos(x); break;
      case DetFn::PowInt: y = det::pow_int(x, e.n); break;
    }
    ++r.checked;
    // A NaN's payload is no part of the definition: NaN in, NaN out.
    const bool same = std::isnan(from_bits(e.output)) ? std::isnan(y) : to_bits(y) == e.output;
    if (!same) {
      ++r.mismatches;
      report << "fn " << static_cast<int>(e.fn) << " input 0x" << std::hex << e.input << std::dec << " n " << e.n
             << ": got 0x" << std::hex << to_bits(y) << ", the table says 0x" << e.output << std::dec << "\n";
    }
  }
  for (const DetGoldenStream& st : kDetGoldenStreams) {
    const uint64_t h = det_stream_hash(st, [](DetFn fn, double x, long long n) {
      switch (fn) {
        case DetFn::Exp: return det::exp(x);
        case DetFn::Log: return det::log(x);
        case DetFn::Cos: return det::cos(x);
        case DetFn::PowInt: return det::pow_int(x, n);
      }
      return 0.0;
    });
    ++r.streams;
    if (h != st.hash) {
      ++r.mismatches;
      report << "stream fn " << static_cast<int>(st.fn) << " [" << st.lo << ", " << st.hi << ") x " << st.count
             << ": hash 0x" << std::hex << h << ", the table says 0x" << st.hash << std::dec << "\n";
    }
  }
  r.report = report.str();
  return r;
}
