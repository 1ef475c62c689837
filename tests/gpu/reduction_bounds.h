// Error bounds for the CUDA backend's reductions against the CPU reference, derived from
// the summation order, and a host emulation of that order. Plain C++ (no CUDA), so a
// CPU test (tests/test_reduction_bounds.cpp) checks the bounds themselves on every CI
// run: the emulated GPU order must fall within them, a reduction that is wrong in a
// small way (one element lost from a ragged slice, a float accumulator) must not, and
// the bounds must stay within a few ulp. tests/ops/ (test_ops on cuda) applies the
// same bounds to the real GPU.
//
// Derivation. The reference (kernels/ref/reference.cpp) and the GPU kernels
// (kernels/cuda/elementwise_ops.cu) evaluate the same formulas with the same types:
// every per-element term is computed by the same double operations in the same order
// (with -fmad=false and -ffp-contract=off neither side fuses), so the terms are equal
// bit for bit. Only the order in which the m terms of a channel are added differs
// (reference: element order; GPU: reduction_order.h). Any order of adding m doubles,
// including a tree, is within gamma(m - 1) * sum|t_i| of the exact sum, where
// gamma(k) = k u / (1 - k u) and u = 2^-53 (Higham, Accuracy and Stability of Numerical
// Algorithms, 2nd ed., eq. 4.4 and section 4.3, which covers every order), so two
// orders differ by at most
//     D = 2 gamma(m - 1) sum |t_i|.
// Quantities computed from such sums (mean = sum / m, invstd = 1 / sqrt(sq / m + eps),
// the normalised output, dx) carry that difference through their own few operations,
// bounded below to first order plus each side's own rounding in those operations
// (a few u relative). The result is then rounded to float once on each side, and two
// doubles a and b round to floats that differ by at most
//     |a - b| + ulp_f(max(|a|, |b|))
// (each rounding moves by at most half an ulp). So each float output is checked
// against  E + ulp_f(|want| + E)  with E the double-level bound: about one ulp, since E
// is some 1e-12 of the value, except where the output itself cancels to near zero.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/reduction_order.h"
#include "kernels/ops.h"

namespace reduction_bounds {

constexpr double kUnitDouble = 0x1p-53;  // unit roundoff of double

inline double gamma(int64_t k) {
  const double ku = static_cast<double>(k) * kUnitDouble;
  return ku / (1.0 - ku);
}

// Two orders of adding m terms of absolute sum abs_sum differ by at most this.
inline double order_difference(int64_t m, double abs_sum) {
  return 2.0 * gamma(m > 1 ? m - 1 : 1) * abs_sum;
}

// The spacing of floats at magnitude |v| (the smallest subnormal spacing near zero).
inline double ulp_float(double v) {
  const float f = static_cast<float>(std::fabs(v));
  if (!std::isfinite(f)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity())) - f;
}

// The bound for a float output whose two double computations differ by at most e.
inline double float_bound(double want, double e) { return e + ulp_float(std::fabs(want) + e); }

// ---- Bounds for batch normalisation, per channel ------------------------------------

// Double-level bounds on how far the GPU's per-channel values may be from the
// reference's, from the inputs of one channel.
struct ChannelBounds {
  double mean = 0, sq = 0, invstd = 0;       // forward statistics
  double mean_value = 0, invstd_value = 0;   // the values themselves (reference's)
  double sum_dy = 0, sum_dy_xhat = 0;        // backward sums
};

// Forward statistics of channel `ch`. Terms: x_i for the sum; (x_i - mean)^2 for sq.
// mean: D(sum|x|) / m, plus each side's division rounding (u |mean| each).
// sq: the terms differ between the sides because their means do (by dm = bound on
// mean); sum (x_i - mean')^2 - sum (x_i - mean)^2 = dm (2 sum (x_i - mean) - m dm'),
// and |sum (x_i - mean)| is itself at most a rounding-level quantity (the computed mean
// is within gamma(m) sum|x| / m + u |mean| of the exact one); plus D(sq) for the order
// and 2 u per term (subtraction, square) on each side: 2 gamma(m + 2) sq in all.
// invstd = 1 / sqrt(var + eps), var = sq / m: relative error r of var + eps becomes r / 2
// in the square root, plus 2 u (sqrt, division) on each side.
inline ChannelBounds forward_bounds(const engine::kernels::BatchNormShape& s, const float* x,
                                    int ch, float eps) {
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  double sum = 0, abs_sum = 0;
  for (int i = 0; i < s.n; ++i)
    for (int j = 0; j < s.hw; ++j) {
      const double v = x[(static_cast<int64_t>(i) * s.c + ch) * s.hw + j];
      sum += v;
      abs_sum += std::fabs(v);
    }
  const double md = static_cast<double>(m);
  const double mean = sum / md;
  ChannelBounds b;
  b.mean_value = mean;
  b.mean = order_difference(m, abs_sum) / md + 2.0 * kUnitDouble * std::fabs(mean);
  const double mean_to_exact = gamma(m) * abs_sum / md + kUnitDouble * std::fabs(mean);
  double sq = 0;
  for (int i = 0; i < s.n; ++i)
    for (int j = 0; j < s.hw; ++j) {
      const double d = x[(static_cast<int64_t>(i) * s.c + ch) * s.hw + j] - mean;
      sq += d * d;
    }
  b.sq = 2.0 * gamma(m + 2) * sq + b.mean * (2.0 * md * mean_to_exact + md * b.mean);
  const double var_eps = sq / md + static_cast<double>(eps);
  const double r = (b.sq / md) / var_eps + 2.0 * kUnitDouble;
  b.invstd_value = 1.0 / std::sqrt(var_eps);
  b.invstd = b.invstd_value * (0.5 * r * (1.0 + r) + 4.0 * kUnitDouble);
  return b;
}

// Backward sums of channel `ch` from the saved statistics (floats, the same on both
// sides): terms dy_i and dy_i * (x_i - mean) * invstd, equal on both sides.
inline ChannelBounds backward_bounds(const engine::kernels::BatchNormShape& s, const float* x,
                                     const float* dy, double mean, double invstd, int ch) {
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  double abs_dy = 0, abs_dy_xhat = 0;
  for (int i = 0; i < s.n; ++i)
    for (int j = 0; j < s.hw; ++j) {
      const int64_t idx = (static_cast<int64_t>(i) * s.c + ch) * s.hw + j;
      abs_dy += std::fabs(dy[idx]);
      abs_dy_xhat += std::fabs(dy[idx] * (x[idx] - mean) * invstd);
    }
  ChannelBounds b;
  b.sum_dy = order_difference(m, abs_dy);
  b.sum_dy_xhat = order_difference(m, abs_dy_xhat);
  return b;
}

// Per-element and per-channel float bounds of batchnorm_forward_train's outputs.
struct ForwardTolerances {
  std::vector<double> y, save_mean, save_invstd, running_mean, running_var;
};

// want_*: the reference's outputs; running_mean0/var0: the running statistics before.
// y = (x - mean) * invstd * g + b: |dy| <= |invstd g| dm + |(x - mean) g| dinv, plus 4 u
// of the terms' magnitude for each side's own roundings (subtract, two multiplies, add).
// running_mean = (1 - mom) rm + mom mean: mom dm; running_var: mom dsq / (m - 1).
inline ForwardTolerances forward_tolerances(const engine::kernels::BatchNormShape& s,
                                            const float* x, const float* gamma_, const float* beta,
                                            float eps, float momentum,
                                            const std::vector<float>& want_y,
                                            const std::vector<float>& want_rm,
                                            const std::vector<float>& want_rv,
                                            const std::vector<float>& want_mean,
                                            const std::vector<float>& want_invstd) {
  ForwardTolerances t;
  const std::size_t total = static_cast<std::size_t>(s.n) * s.c * s.hw;
  t.y.assign(total, 0.0);
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  for (int ch = 0; ch < s.c; ++ch) {
    const ChannelBounds b = forward_bounds(s, x, ch, eps);
    const double g = std::fabs(static_cast<double>(gamma_[ch]));
    for (int i = 0; i < s.n; ++i)
      for (int j = 0; j < s.hw; ++j) {
        const std::size_t idx = (static_cast<std::size_t>(i) * s.c + ch) * s.hw + j;
        const double centred = std::fabs(x[idx] - b.mean_value);
        const double magnitude = centred * b.invstd_value * g + std::fabs(beta[ch]);
        const double e = b.invstd_value * g * b.mean + centred * g * b.invstd +
                         8.0 * kUnitDouble * magnitude;
        t.y[idx] = float_bound(want_y[idx], e);
      }
    t.save_mean.push_back(float_bound(want_mean[ch], b.mean));
    t.save_invstd.push_back(float_bound(want_invstd[ch], b.invstd));
    const double mom = momentum;
    t.running_mean.push_back(float_bound(want_rm[ch], mom * b.mean + 4.0 * kUnitDouble * std::fabs(want_rm[ch])));
    const double unbiased_e = m > 1 ? b.sq / static_cast<double>(m - 1) : b.sq / static_cast<double>(m);
    t.running_var.push_back(float_bound(want_rv[ch], mom * unbiased_e + 4.0 * kUnitDouble * std::fabs(want_rv[ch])));
  }
  return t;
}

struct BackwardTolerances {
  std::vector<double> dx, dgamma, dbeta;
};

// dx = k (m dy - S1 - xhat S2), k = g invstd / m: |ddx| <= |k| (dS1 + |xhat| dS2), plus
// 6 u of the terms' magnitude for each side's own roundings.
inline BackwardTolerances backward_tolerances(const engine::kernels::BatchNormShape& s,
                                              const float* x, const float* dy, const float* gamma_,
                                              const float* save_mean, const float* save_invstd,
                                              const std::vector<float>& want_dx,
                                              const std::vector<float>& want_dgamma,
                                              const std::vector<float>& want_dbeta) {
  BackwardTolerances t;
  const std::size_t total = static_cast<std::size_t>(s.n) * s.c * s.hw;
  t.dx.assign(total, 0.0);
  const double md = static_cast<double>(s.n) * s.hw;
  for (int ch = 0; ch < s.c; ++ch) {
    const double mean = save_mean[ch], invstd = save_invstd[ch];
    const ChannelBounds b = backward_bounds(s, x, dy, mean, invstd, ch);
    // |S1| and |S2| themselves, for the rounding term.
    double s1 = 0, s2 = 0;
    for (int i = 0; i < s.n; ++i)
      for (int j = 0; j < s.hw; ++j) {
        const std::size_t idx = (static_cast<std::size_t>(i) * s.c + ch) * s.hw + j;
        s1 += dy[idx];
        s2 += dy[idx] * (x[idx] - mean) * invstd;
      }
    const double k = std::fabs(static_cast<double>(gamma_[ch]) * invstd / md);
    for (int i = 0; i < s.n; ++i)
      for (int j = 0; j < s.hw; ++j) {
        const std::size_t idx = (static_cast<std::size_t>(i) * s.c + ch) * s.hw + j;
        const double xhat = std::fabs((x[idx] - mean) * invstd);
        const double magnitude = k * (md * std::fabs(dy[idx]) + std::fabs(s1) + xhat * std::fabs(s2));
        const double e = k * (b.sum_dy + xhat * b.sum_dy_xhat) + 12.0 * kUnitDouble * magnitude;
        t.dx[idx] = float_bound(want_dx[idx], e);
      }
    t.dgamma.push_back(float_bound(want_dgamma[ch], b.sum_dy_xhat));
    t.dbeta.push_back(float_bound(want_dbeta[ch], b.sum_dy));
  }
  return t;
}

// channel_sum (the conv and linear bias gradients): out[ch] = float(sum of the channel).
inline std::vector<double> channel_sum_tolerances(int n, int c, int64_t hw, const float* x,
                                                  const std::vector<float>& want) {
  std::vector<double> t;
  const int64_t m = static_cast<int64_t>(n) * hw;
  for (int ch = 0; ch < c; ++ch) {
    double abs_sum = 0;
    for (int i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) abs_sum += std::fabs(x[(static_cast<int64_t>(i) * c + ch) * hw + j]);
    t.push_back(float_bound(want[ch], order_difference(m, abs_sum)));
  }
  return t;
}

// ---- Checking -------------------------------------------------------------------------

struct Comparison {
  std::size_t bad = 0, first_bad = 0;
  double worst_ratio = 0;   // max |got - want| / bound
  double worst_ulps = 0;    // max bound / ulp_f(want): how loose the bound is
  std::size_t count = 0;
  std::string describe(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<double>& bound) const {
    std::string text = std::to_string(bad) + " of " + std::to_string(count) +
                       " outside the bound; worst |got - want| / bound " + std::to_string(worst_ratio) +
                       "; loosest bound " + std::to_string(worst_ulps) + " ulp";
    if (bad)
      text += "; first at " + std::to_string(first_bad) + ": got " + std::to_string(got[first_bad]) +
              ", want " + std::to_string(want[first_bad]) + ", bound " + std::to_string(bound[first_bad]);
    return text;
  }
};

// |got - want| <= bound elementwise (NaN matches NaN).
inline Comparison compare(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<double>& bound) {
  Comparison c;
  c.count = got.size();
  if (got.size() != want.size() || bound.size() != want.size()) {
    c.bad = c.count ? c.count : 1;
    return c;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(g) && std::isnan(w)) continue;
    const double diff = std::fabs(g - w);
    const double ratio = bound[i] > 0 ? diff / bound[i] : (diff > 0 ? INFINITY : 0.0);
    if (ratio > c.worst_ratio) c.worst_ratio = ratio;
    const double ulps = bound[i] / ulp_float(w);
    if (ulps > c.worst_ulps) c.worst_ulps = ulps;
    if (!(diff <= bound[i]) && c.bad++ == 0) c.first_bad = i;
  }
  return c;
}

// ---- The GPU's order, on the host -------------------------------------------------------

// How an emulated reduction goes wrong (for the CPU test that the bounds catch it).
enum class Fault {
  None,
  DropLastElementOfRaggedSlice,  // the last (shorter) slice stops one element short
  FloorSliceLength,              // slice length m / slices rounded down: the tail is lost
};

// The sum over channel ch of term(e) for e in [0, m), in the GPU's order
// (reduction_order.h): per slice, per thread strided, the block tree, slices in order.
template <typename Term>
double gpu_order_sum(int64_t m, Term term, Fault fault = Fault::None) {
  using engine::kernels::cuda::channel_slices;
  using engine::kernels::cuda::kReduceThreads;
  using engine::kernels::cuda::slice_length;
  const int slices = channel_slices(m);
  const int64_t length = fault == Fault::FloorSliceLength ? m / slices : slice_length(m, slices);
  double total = 0.0;
  for (int sl = 0; sl < slices; ++sl) {
    const int64_t begin = std::min<int64_t>(static_cast<int64_t>(sl) * length, m);
    int64_t end = std::min<int64_t>(begin + length, m);
    if (fault == Fault::DropLastElementOfRaggedSlice && sl == slices - 1 && end - begin < length &&
        end > begin)
      --end;
    double value[kReduceThreads];
    for (int t = 0; t < kReduceThreads; ++t) {
      double acc = 0.0;
      for (int64_t e = begin + t; e < end; e += kReduceThreads) acc += term(e);
      value[t] = acc;
    }
    for (int half = kReduceThreads / 2; half > 0; half >>= 1)
      for (int t = 0; t < half; ++t) value[t] += value[t + half];
    total += value[0];
  }
  return total;
}

// batchnorm_forward_train and batchnorm_backward as the GPU computes them (the
// kernels' formulas, the GPU's order), on the host.
inline void emulate_batchnorm_forward_train(const engine::kernels::BatchNormShape& s, const float* x,
                                            const float* gamma_, const float* beta, float eps,
                                            float momentum, float* running_mean, float* running_var,
                                            float* save_mean, float* save_invstd, float* y,
                                            Fault fault = Fault::None) {
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  for (int ch = 0; ch < s.c; ++ch) {
    auto at = [&](int64_t e) { return ((e / s.hw) * s.c + ch) * s.hw + e % s.hw; };
    const double sum = gpu_order_sum(m, [&](int64_t e) { return static_cast<double>(x[at(e)]); }, fault);
    const double mean = sum / static_cast<double>(m);
    const double sq = gpu_order_sum(m, [&](int64_t e) {
      const double d = static_cast<double>(x[at(e)]) - mean;
      return d * d;
    }, fault);
    const double var = sq / static_cast<double>(m);
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    save_mean[ch] = static_cast<float>(mean);
    save_invstd[ch] = static_cast<float>(invstd);
    const double unbiased = m > 1 ? sq / static_cast<double>(m - 1) : var;
    const double mom = momentum;
    running_mean[ch] = static_cast<float>((1.0 - mom) * running_mean[ch] + mom * mean);
    running_var[ch] = static_cast<float>((1.0 - mom) * running_var[ch] + mom * unbiased);
    const double g = gamma_[ch], b = beta[ch];
    for (int64_t e = 0; e < m; ++e)
      y[at(e)] = static_cast<float>((static_cast<double>(x[at(e)]) - mean) * invstd * g + b);
  }
}

inline void emulate_batchnorm_backward(const engine::kernels::BatchNormShape& s, const float* x,
                                       const float* dy, const float* gamma_, const float* save_mean,
                                       const float* save_invstd, float* dx, float* dgamma,
                                       float* dbeta, Fault fault = Fault::None) {
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  const double md = static_cast<double>(m);
  for (int ch = 0; ch < s.c; ++ch) {
    auto at = [&](int64_t e) { return ((e / s.hw) * s.c + ch) * s.hw + e % s.hw; };
    const double mean = save_mean[ch], invstd = save_invstd[ch];
    const double sum_dy = gpu_order_sum(m, [&](int64_t e) { return static_cast<double>(dy[at(e)]); }, fault);
    const double sum_dy_xhat = gpu_order_sum(m, [&](int64_t e) {
      const double g = dy[at(e)];
      return g * (static_cast<double>(x[at(e)]) - mean) * invstd;
    }, fault);
    dbeta[ch] = static_cast<float>(sum_dy);
    dgamma[ch] = static_cast<float>(sum_dy_xhat);
    const double k = static_cast<double>(gamma_[ch]) * invstd / md;
    for (int64_t e = 0; e < m; ++e) {
      const double xhat = (static_cast<double>(x[at(e)]) - mean) * invstd;
      dx[at(e)] = static_cast<float>(k * (md * dy[at(e)] - sum_dy - xhat * sum_dy_xhat));
    }
  }
}

inline void emulate_channel_sum(int n, int c, int64_t hw, const float* x, float* out,
                                Fault fault = Fault::None) {
  const int64_t m = static_cast<int64_t>(n) * hw;
  for (int ch = 0; ch < c; ++ch)
    out[ch] = static_cast<float>(gpu_order_sum(m, [&](int64_t e) {
      return static_cast<double>(x[((e / hw) * c + ch) * hw + e % hw]);
    }, fault));
}

// The ragged shapes of the issue (bn2 at n = 128 and at the last batch n = 88 of the
// default run, bn1 at n = 88, tiny ones with a ragged slice) and what they exercise.
inline std::vector<engine::kernels::BatchNormShape> ragged_shapes() {
  return {{128, 64, 196},  // 25088 per channel: 25 slices of 1004, the last 992
          {88, 64, 196},   // 17248: 17 slices of 1015, the last 1008
          {88, 32, 784},   // 68992: capped at 32 slices of 2156 (even; ~8 per thread)
          {3, 5, 1025},    // 3075: 4 slices of 769, the last 768
          {1, 7, 5000}};   // 5000: 5 slices of 1000 (exact), n = 1
}

}  // namespace reduction_bounds
