// The engine's own transcendentals (kernels/det_math.h) on given inputs, for
// tools/det_golden.py, which pins their bits in tests/data/det_golden.inc. Reads lines
// "exp|log|cos 0xBITS 0" or "pow_int 0xBITS N" and prints each with the result's bits;
// "stream FN uniform|binades LO HI N_MAX COUNT SEED" prints the stream's hash
// (tests/det_golden.h).
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "det_golden.h"
#include "kernels/det_math.h"

namespace det = engine::kernels::det;

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    if (line.rfind("stream ", 0) == 0) {
      std::string word, fn, draw;
      DetGoldenStream st{};
      in >> word >> fn >> draw >> st.lo >> st.hi >> st.n_max >> st.count >> st.seed;
      st.fn = fn == "exp" ? DetFn::Exp : fn == "log" ? DetFn::Log : fn == "cos" ? DetFn::Cos : DetFn::PowInt;
      st.draw = draw == "binades" ? DetDraw::Binades : DetDraw::Uniform;
      const uint64_t h = det_stream_hash(st, [](DetFn f, double x, long long n) {
        switch (f) {
          case DetFn::Exp: return det::exp(x);
          case DetFn::Log: return det::log(x);
          case DetFn::Cos: return det::cos(x);
          case DetFn::PowInt: return det::pow_int(x, n);
        }
        return 0.0;
      });
      std::printf("stream 0x%016" PRIx64 "\n", h);
      continue;
    }
    std::string fn, hex;
    long long n = 0;
    in >> fn >> hex;
    if (fn == "pow_int") in >> n;
    const uint64_t bits = std::stoull(hex, nullptr, 16);
    double x;
    std::memcpy(&x, &bits, 8);
    double y;
    if (fn == "exp") y = det::exp(x);
    else if (fn == "log") y = det::log(x);
    else if (fn == "cos") y = det::cos(x);
    else if (fn == "pow_int") y = det::pow_int(x, n);
    else {
      std::cerr << "det_dump: unknown function '" << fn << "'\n";
      return 2;
    }
    uint64_t out;
    std::memcpy(&out, &y, 8);
    std::printf("%s 0x%016" PRIx64 " %lld 0x%016" PRIx64 "\n", fn.c_str(), bits, n, out);
  }
  return 0;
}
