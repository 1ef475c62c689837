// The transcendentals the training step uses, defined once by the engine: exp, log, cos
// and an integer power, in double. glibc picks its exp/log/pow/cos by CPU features when
// it loads (FMA and non-FMA code) and they may differ in the last bit between CPUs; these
// use only IEEE-754 +, -, *, / (each correctly rounded, contraction off: -ffp-contract=off)
// and exact scalings by powers of two, so they give the same bits on every CPU. Each is
// within about 1 ulp of the true value (tests/test_det_math.cpp bounds it against libm).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/kernels/hd.h"

namespace engine::kernels::det {

// e^x. Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, then Taylor to r^13 (the next
// term is below 2^-56 of the result), then the exact scaling by 2^k.
inline double exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893384) return std::numeric_limits<double>::infinity();
  if (x < -745.1332191019412) return 0.0;
  constexpr double kInvLn2 = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 with its last 32 bits zero: k * hi is exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - hi
  const double k = std::floor(x * kInvLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // 1 + r + r^2/2! + ... + r^13/13!, by Horner.
  constexpr double c[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                          1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,      1.0 / 720.0,
                          1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,         0.5};
  double p = c[0];
  for (int i = 1; i < 12; ++i) p = p * r + c[i];
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^k in two exact steps, so that a subnormal result is rounded once.
  const int ki = static_cast<int>(k);
  if (ki < -1000) return std::ldexp(std::ldexp(p, ki + 1000), -1000);
  return std::ldexp(p, ki);
}

// ln x. x = m 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m-1)/(m+1),
// |s| <= 0.1716, by its odd series to s^21; then e ln2 in two parts.
inline double log(double x) {
  if (x != x || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  int e = 0;
  double m = std::frexp(x, &e);  // exact: m in [0.5, 1)
  if (m < 0.70710678118654752440) m *= 2.0, --e;
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f);
  const double s2 = s * s;
  // 2 (s + s^3/3 + ... + s^21/21) = 2s + s * (2 s^2/3 + 2 s^4/5 + ...)
  double q = 2.0 / 21.0;
  for (int n = 19; n >= 3; n -= 2) q = q * s2 + 2.0 / n;
  const double log_m = 2.0 * s + s * (s2 * q);
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double ed = static_cast<double>(e);
  return ed * kLn2Hi + (ed * kLn2Lo + log_m);
}

// cos x for |x| up to about 1e6 (the cosine schedule asks for x in [0, pi]): x reduced by
// pi/2 in three parts (Cody-Waite), then the sine or cosine series on [-pi/4, pi/4].
inline double cos(double x) {
  if (x != x || std::fabs(x) == std::numeric_limits<double>::infinity())
    return std::numeric_limits<double>::quiet_NaN();
  constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  constexpr double kPio2_1 = 1.57079632673412561417e+00;   // first 33 bits of pi/2
  constexpr double kPio2_2 = 6.07710050630396597660e-11;   // next 33 bits
  constexpr double kPio2_3 = 2.02226624871116645580e-21;   // the rest
  const double q = std::floor(x * kTwoOverPi + 0.5);
  const double r = ((x - q * kPio2_1) - q * kPio2_2) - q * kPio2_3;
  const double r2 = r * r;
  // cos r = sum_j (-1)^j r^2j / (2j)!, j <= 9; sin r = r sum_j (-1)^j r^2j / (2j+1)!, j <= 8;
  // Horner in r^2 from the highest term.
  constexpr double kCos[] = {-1.0 / 6402373705728000.0, 1.0 / 20922789888000.0, -1.0 / 87178291200.0,
                             1.0 / 479001600.0,         -1.0 / 3628800.0,      1.0 / 40320.0,
                             -1.0 / 720.0,              1.0 / 24.0,            -0.5,
                             1.0};
  constexpr double kSin[] = {1.0 / 355687428096000.0, -1.0 / 1307674368000.0, 1.0 / 6227020800.0,
                             -1.0 / 39916800.0,       1.0 / 362880.0,         -1.0 / 5040.0,
                             1.0 / 120.0,             -1.0 / 6.0,             1.0};
  double cos_r = kCos[0];
  for (int i = 1; i < 10; ++i) cos_r = cos_r * r2 + kCos[i];
  double sin_r = kSin[0];
  for (int i = 1; i < 9; ++i) sin_r = sin_r * r2 + kSin[i];
  sin_r *= r;
  switch (static_cast<int64_t>(q) & 3) {
    case 0: return cos_r;
    case 1: return -sin_r;
    case 2: return -cos_r;
    default: return sin_r;
  }
}

// base^n for a whole n >= 0, by repeated squaring (the same multiplications, in the
// same order, on every CPU): the Adam bias corrections beta^t.
ENGINE_HD double pow_int(double base, int64_t n) {
  double result = 1.0, square = base;
  for (; n > 0; n >>= 1) {
    if (n & 1) result *= square;
    square *= square;
  }
  return result;
}

}  // namespace engine::kernels::det
