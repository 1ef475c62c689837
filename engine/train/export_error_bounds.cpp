// The tolerance of the export's probes (export_error_bounds.h): a float32 error bound
// carried through the graph next to the exact values.
#include "train/export_error_bounds.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "engine/train/export.h"

namespace engine {
namespace export_internal {

namespace {

// ---- the tolerance ----------------------------------------------------------------------
//
// Any float32 evaluation of the graph, whatever its summation order, lies within a bound
// of the exact (real-number) value. For a dot product of K terms plus a bias computed in
// any order (with or without FMA), |fl(s) - s| <= gamma(K+1) * (sum |w||x| + |b|), with
// gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, "Accuracy and Stability of Numerical
// Algorithms", 3.1). An input already off by e adds sum |w| e. Batch norm in any of its
// forms (scale and shift computed separately, or folded into the convolution's weights
// and bias by a runtime) adds at most kBatchNormUlps u relative to its terms; max pool
// and ReLU pass the bound through unchanged. The bound is carried through the graph in
// double precision next to the exact values, per probe and per logit. Two evaluations
// (the engine's and a consumer's) then differ by at most twice it: the tolerance.
constexpr double kUnitRoundoff = 1.0 / 16777216.0;  // 2^-24
// sqrt, the division by it, the product with gamma, the subtraction of the mean, the
// product and the shift: six roundings, two more for a runtime that folds the scale into
// the convolution's weights and bias, each at most u relative.
constexpr double kBatchNormUlps = 8;

double gamma_n(int64_t n) {
  const double nu = static_cast<double>(n) * kUnitRoundoff;
  return nu / (1 - nu);
}

// Activations of one probe: exact values (double) and their error bounds.
struct Bounded {
  std::vector<double> value, err;
  int64_t c = 0, h = 0, w = 0;  // c features when h = w = 1
};

std::vector<double> host_doubles(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return std::vector<double>(f.begin(), f.end());
}

Bounded bound_step(const Step& s, const Bounded& in, const StateDict& state) {
  Bounded out;
  switch (s.kind) {
    case Step::Kind::Conv: {
      const std::vector<double> w = host_doubles(state.get_tensor(s.name + ".weight"));
      const std::vector<double> b = host_doubles(state.get_tensor(s.name + ".bias"));
      const int64_t k = s.kernel, H = in.h, W = in.w;
      const int64_t oh = H + 2 * s.pad - k + 1, ow = W + 2 * s.pad - k + 1;
      out.c = s.out, out.h = oh, out.w = ow;
      out.value.assign(static_cast<size_t>(out.c * oh * ow), 0);
      out.err.assign(out.value.size(), 0);
      const double g = gamma_n(static_cast<int64_t>(s.in) * k * k + 1);
      for (int64_t o = 0; o < out.c; ++o)
        for (int64_t y = 0; y < oh; ++y)
          for (int64_t x = 0; x < ow; ++x) {
            double sum = b[static_cast<size_t>(o)], mag = std::fabs(sum), prop = 0;
            for (int64_t c = 0; c < s.in; ++c)
              for (int64_t ky = 0; ky < k; ++ky) {
                const int64_t iy = y + ky - s.pad;
                if (iy < 0 || iy >= H) continue;
                for (int64_t kx = 0; kx < k; ++kx) {
                  const int64_t ix = x + kx - s.pad;
                  if (ix < 0 || ix >= W) continue;
                  const double wv = w[static_cast<size_t>(((o * s.in + c) * k + ky) * k + kx)];
                  const size_t i = static_cast<size_t>((c * H + iy) * W + ix);
                  sum += wv * in.value[i];
                  mag += std::fabs(wv) * (std::fabs(in.value[i]) + in.err[i]);
                  prop += std::fabs(wv) * in.err[i];
                }
              }
            const size_t j = static_cast<size_t>((o * oh + y) * ow + x);
            out.value[j] = sum;
            out.err[j] = prop + g * mag;
          }
      return out;
    }
    case Step::Kind::BatchNorm: {
      const std::vector<double> gamma = host_doubles(state.get_tensor(s.name + ".weight"));
      const std::vector<double> beta = host_doubles(state.get_tensor(s.name + ".bias"));
      const std::vector<double> mean = host_doubles(state.get_tensor(s.name + ".running_mean"));
      const std::vector<double> var = host_doubles(state.get_tensor(s.name + ".running_var"));
      out = in;
      const int64_t plane = in.h * in.w;
      for (int64_t c = 0; c < in.c; ++c) {
        const size_t ci = static_cast<size_t>(c);
        const double scale = gamma[ci] / std::sqrt(var[ci] + static_cast<double>(static_cast<float>(s.eps)));
        for (int64_t i = 0; i < plane; ++i) {
          const size_t j = static_cast<size_t>(c * plane + i);
          const double y = in.value[j];
          out.value[j] = (y - mean[ci]) * scale + beta[ci];
          out.err[j] = std::fabs(scale) * in.err[j] +
                       kBatchNormUlps * kUnitRoundoff *
                           (std::fabs(scale) * (std::fabs(y) + in.err[j] + std::fabs(mean[ci])) + std::fabs(beta[ci]));
        }
      }
      return out;
    }
    case Step::Kind::MaxPool2x2: {
      out.c = in.c, out.h = in.h / 2, out.w = in.w / 2;
      out.value.resize(static_cast<size_t>(out.c * out.h * out.w));
      out.err.resize(out.value.size());
      for (int64_t c = 0; c < out.c; ++c)
        for (int64_t y = 0; y < out.h; ++y)
          for (int64_t x = 0; x < out.w; ++x) {
            double v = -INFINITY, e = 0;
            for (int64_t dy = 0; dy < 2; ++dy)
              for (int64_t dx = 0; dx < 2; ++dx) {
                const size_t i = static_cast<size_t>((c * in.h + 2 * y + dy) * in.w + 2 * x + dx);
                v = std::max(v, in.value[i]);
                e = std::max(e, in.err[i]);
              }
            const size_t j = static_cast<size_t>((c * out.h + y) * out.w + x);
            out.value[j] = v;
            out.err[j] = e;  // max is 1-Lipschitz in the largest input error
          }
      return out;
    }
    case Step::Kind::Relu:
      out = in;
      for (double& v : out.value) v = std::max(v, 0.0);
      return out;
    case Step::Kind::Flatten:
      out = in;
      out.c = in.c * in.h * in.w, out.h = out.w = 1;
      return out;
    case Step::Kind::Linear: {
      const std::vector<double> w = host_doubles(state.get_tensor(s.name + ".weight"));
      const std::vector<double> b = host_doubles(state.get_tensor(s.name + ".bias"));
      if (in.c * in.h * in.w != s.in) throw ExportError("layer " + s.name + ": input size mismatch");
      out.c = s.out, out.h = out.w = 1;
      out.value.resize(static_cast<size_t>(s.out));
      out.err.resize(static_cast<size_t>(s.out));
      const double g = gamma_n(static_cast<int64_t>(s.in) + 1);
      for (int64_t o = 0; o < s.out; ++o) {
        double sum = b[static_cast<size_t>(o)], mag = std::fabs(sum), prop = 0;
        for (int64_t i = 0; i < s.in; ++i) {
          const double wv = w[static_cast<size_t>(o * s.in + i)];
          const size_t ii = static_cast<size_t>(i);
          sum += wv * in.value[ii];
          mag += std::fabs(wv) * (std::fabs(in.value[ii]) + in.err[ii]);
          prop += std::fabs(wv) * in.err[ii];
        }
        out.value[static_cast<size_t>(o)] = sum;
        out.err[static_cast<size_t>(o)] = prop + g * mag;
      }
      return out;
    }
  }
  throw std::logic_error("bound_step: unknown step");
}

}  // namespace

std::vector<float> probe_tolerances(const std::vector<Step>& steps, const StateDict& state, const ImageShape& shape,
                                    const std::vector<float>& inputs, int probes) {
  std::vector<float> tol;
  const int64_t numel = shape.numel();
  for (int p = 0; p < probes; ++p) {
    Bounded a;
    a.c = shape.channels, a.h = shape.height, a.w = shape.width;
    a.value.assign(inputs.begin() + p * numel, inputs.begin() + (p + 1) * numel);
    a.err.assign(static_cast<size_t>(numel), 0.0);  // the stored float32 input is exact
    for (const Step& s : steps) a = bound_step(s, a, state);
    for (const double e : a.err) {
      // Rounded up to float32, so the stored tolerance is never below the bound.
      float t = static_cast<float>(2 * e);
      if (static_cast<double>(t) < 2 * e) t = std::nextafter(t, INFINITY);
      tol.push_back(t);
    }
  }
  return tol;
}

}  // namespace export_internal
}  // namespace engine
