// A reusable central-finite-difference gradient checker.
//
// Usage: give it a function that evaluates a scalar loss (in double) from the current
// contents of a float buffer x, the buffer itself, and the analytic gradient dloss/dx.
// For a random subset of at most `max_checks` elements it sets x[i] to x0 + h and
// x0 - h (rounded to float), evaluates the loss, restores x[i] bit for bit, and compares
//   num = (L(x0+h) - L(x0-h)) / ((x0+h) - (x0-h))      (actual float step, not 2h)
// with the analytic value:
//   |num - ana| <= atol + atol_scale * max_j |ana_j| + rtol * max(|num|, |ana|).
// A NaN on either side fails. The loss is usually L = sum(y * r) for a fixed random r
// (so dL/dy = r, and dL/dx is exactly what a backward op returns for dy = r).
//
// Choosing h and the tolerances:
//  - Central differences have truncation error h^2/6 * f'''. It is zero for ops that are
//    linear in the checked input (conv, linear, dropout, maxpool/relu away from their
//    kinks) and of order h^2 ~ 1e-4 relative for smooth ones (batchnorm, softmax).
//  - Forward passes return float32, so L(x +- h) carries rounding noise of about
//    u * sqrt(#affected outputs) * |y| * |r| (u = 2^-24), divided by 2h in num. With
//    h = 1e-2 that is ~1e-5 relative for the reference ops (double accumulation, one
//    rounding per output); smaller h would amplify it, larger h the truncation error.
//  - rtol = 2e-3 then sits 10-100x above the noise for reference ops and 5x below the
//    smallest error a plausible bug makes: a gradient scaled by 1.01 fails, as does any
//    element swapped, zeroed or sign-flipped (tests/test_gradcheck.cpp checks that the
//    checker rejects exactly these).
//  - Elements whose true gradient is ~0 (e.g. a conv bias followed by batchnorm) would
//    make a pure relative test meaningless; atol_scale * max|ana| gives them an absolute
//    floor proportional to the tensor's gradient scale.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace gradcheck {

struct Options {
  double h = 1e-2;           // perturbation (absolute, in x's units)
  double rtol = 2e-3;        // relative tolerance
  double atol = 0.0;         // absolute tolerance
  double atol_scale = 1e-3;  // absolute tolerance per unit of max |analytic| over the tensor
  int max_checks = 200;      // all elements when n <= max_checks, else a random subset
  uint32_t seed = 12345;     // picks the subset
  int max_reported = 5;      // failures described in Result::detail
};

struct Result {
  int checked = 0;
  int failures = 0;
  double worst = 0.0;  // max over checked elements of |num - ana| / tolerance
  std::string detail;  // the first failures, one per line
  bool ok() const { return checked > 0 && failures == 0; }
};

// The indices checked for a tensor of n elements: all of them when n <= max_checks,
// otherwise the first, the last and a random subset (without repetition).
inline std::vector<int64_t> pick_indices(int64_t n, int max_checks, uint32_t seed) {
  std::vector<int64_t> idx;
  if (n <= 0) return idx;
  if (n <= max_checks) {
    idx.resize(static_cast<std::size_t>(n));
    std::iota(idx.begin(), idx.end(), int64_t{0});
    return idx;
  }
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int64_t> d(0, n - 1);
  idx.push_back(0);
  idx.push_back(n - 1);
  while (static_cast<int>(idx.size()) < max_checks) {
    const int64_t i = d(g);
    if (std::find(idx.begin(), idx.end(), i) == idx.end()) idx.push_back(i);
  }
  return idx;
}

// Checks `analytic` (n elements) against central differences of `loss` with respect to
// x[i] for the indices given. x is restored exactly afterwards.
inline Result check_indices(const std::function<double()>& loss, float* x, int64_t n,
                            const float* analytic, const std::vector<int64_t>& indices,
                            const Options& opt = {}) {
  Result res;
  double scale = 0.0;
  for (int64_t j = 0; j < n; ++j) scale = std::max(scale, std::fabs(static_cast<double>(analytic[j])));
  std::ostringstream out;
  for (const int64_t i : indices) {
    const float x0 = x[i];
    const float xp = static_cast<float>(static_cast<double>(x0) + opt.h);
    const float xm = static_cast<float>(static_cast<double>(x0) - opt.h);
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    const double num = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    const double ana = analytic[i];
    const double err = std::fabs(num - ana);
    const double tol =
        opt.atol + opt.atol_scale * scale + opt.rtol * std::max(std::fabs(num), std::fabs(ana));
    ++res.checked;
    const double ratio = tol > 0.0 ? err / tol : (err > 0.0 ? INFINITY : 0.0);
    if (!(ratio <= res.worst)) res.worst = ratio;  // also records a NaN
    if (!(err <= tol)) {
      if (res.failures < opt.max_reported)
        out << "  [" << i << "] numeric " << num << " analytic " << ana << " |diff| " << err
            << " > tol " << tol << "\n";
      ++res.failures;
    }
  }
  res.detail = out.str();
  return res;
}

inline Result check(const std::function<double()>& loss, float* x, int64_t n,
                    const float* analytic, const Options& opt = {}) {
  return check_indices(loss, x, n, analytic, pick_indices(n, opt.max_checks, opt.seed), opt);
}

// Directional check: perturbs all n elements of x at once by +-step * d[i] (rounded to
// float) and compares L(x+) - L(x-) with sum_i analytic[i] * (x+_i - x-_i), the change the
// analytic gradient predicts for the realised (float-rounded) step. Returns both; x is
// restored exactly. Along d = the analytic gradient itself this tests the whole tensor's
// gradient with one pair of evaluations and the largest possible signal.
struct Directional {
  double numeric = 0.0, analytic = 0.0;
  double rel_error() const {
    return std::fabs(numeric - analytic) / std::max(std::fabs(analytic), 1e-300);
  }
};
inline Directional directional(const std::function<double()>& loss, float* x, int64_t n,
                               const float* analytic, const std::vector<double>& d, double step) {
  std::vector<float> x0(x, x + n), xp(static_cast<std::size_t>(n)), xm(static_cast<std::size_t>(n));
  Directional r;
  for (int64_t i = 0; i < n; ++i) {
    xp[i] = static_cast<float>(static_cast<double>(x0[i]) + step * d[i]);
    xm[i] = static_cast<float>(static_cast<double>(x0[i]) - step * d[i]);
    r.analytic += static_cast<double>(analytic[i]) * (static_cast<double>(xp[i]) - xm[i]);
  }
  std::copy(xp.begin(), xp.end(), x);
  const double lp = loss();
  std::copy(xm.begin(), xm.end(), x);
  const double lm = loss();
  std::copy(x0.begin(), x0.end(), x);
  r.numeric = lp - lm;
  return r;
}

// One line for test messages: "name: 3/200 failed (worst |diff|/tol 4.2)\n  [i] ...".
inline std::string describe(const std::string& name, const Result& r) {
  std::ostringstream o;
  o << name << ": " << r.failures << "/" << r.checked << " failed (worst |diff|/tol " << r.worst
    << ")\n"
    << r.detail;
  return o.str();
}

// L = sum y[i] * r[i], accumulated in double.
inline double dot(const float* y, const float* r, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(y[i]) * static_cast<double>(r[i]);
  return acc;
}
inline double dot(const std::vector<float>& y, const std::vector<float>& r) {
  return dot(y.data(), r.data(), static_cast<int64_t>(std::min(y.size(), r.size())));
}

}  // namespace gradcheck
