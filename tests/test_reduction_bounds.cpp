// The tolerances that tests/ops/ (test_ops on cuda) applies to the CUDA reductions
// (tests/gpu/reduction_bounds.h), checked on the CPU on every CI run: a host emulation
// of the GPU's summation order (kernels/cuda/reduction_order.h, the partition the
// kernels use) must fall within them against ref::, while an emulation that loses an
// element of a ragged slice, or the tail of the channel, must not; and the bounds must
// stay within a few ulp (not 1e-4 of the magnitude), so a one-element error is seen.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/reduction_bounds.h"
#include "kernels/ops.h"

namespace ref = engine::kernels::ref;
namespace rb = reduction_bounds;
using engine::kernels::BatchNormShape;
using engine::kernels::BatchSplit;

namespace {

std::vector<float> uniform(std::size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::string shape_tag(const BatchNormShape& s) {
  return "n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) + " hw=" + std::to_string(s.hw);
}

bool ragged(const BatchNormShape& s) {
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  return m % engine::kernels::cuda::channel_slices(m) != 0;
}

struct BatchNormCase {
  BatchNormShape s;
  std::vector<float> x, dy, gamma, beta, rm0, rv0;
  float eps = 1e-5f, momentum = 0.1f;
  // Reference outputs.
  std::vector<float> rm, rv, mean, invstd, y, dx, dgamma, dbeta;
};

BatchNormCase make_case(const BatchNormShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  BatchNormCase c;
  c.s = s;
  const std::size_t total = static_cast<std::size_t>(s.n) * s.c * s.hw, ch = s.c;
  // An offset mean (x in [-2, 3]) so the two-pass variance matters.
  c.x = uniform(total, rng, -2.0f, 3.0f);
  c.dy = uniform(total, rng, -1.0f, 1.0f);
  c.gamma = uniform(ch, rng, 0.5f, 1.5f);
  c.beta = uniform(ch, rng, -1.0f, 1.0f);
  c.rm0 = uniform(ch, rng, -1.0f, 1.0f);
  c.rv0 = uniform(ch, rng, 0.5f, 2.0f);
  c.rm = c.rm0, c.rv = c.rv0;
  c.mean.resize(ch), c.invstd.resize(ch), c.y.resize(total), c.dx.resize(total);
  c.dgamma.resize(ch), c.dbeta.resize(ch);
  ref::batchnorm_forward_train(s, BatchSplit{}, c.x.data(), c.gamma.data(), c.beta.data(), c.eps, c.momentum,
                               c.rm.data(), c.rv.data(), c.mean.data(), c.invstd.data(), c.y.data());
  ref::batchnorm_backward(s, BatchSplit{}, c.x.data(), c.dy.data(), c.gamma.data(), c.mean.data(), c.invstd.data(),
                          c.dx.data(), c.dgamma.data(), c.dbeta.data());
  return c;
}

struct Emulated {
  std::vector<float> rm, rv, mean, invstd, y, dx, dgamma, dbeta;
};

Emulated emulate(const BatchNormCase& c, rb::Fault fault) {
  Emulated e;
  const std::size_t total = c.x.size(), ch = c.gamma.size();
  e.rm = c.rm0, e.rv = c.rv0;
  e.mean.resize(ch), e.invstd.resize(ch), e.y.resize(total), e.dx.resize(total);
  e.dgamma.resize(ch), e.dbeta.resize(ch);
  rb::emulate_batchnorm_forward_train(c.s, c.x.data(), c.gamma.data(), c.beta.data(), c.eps,
                                      c.momentum, e.rm.data(), e.rv.data(), e.mean.data(),
                                      e.invstd.data(), e.y.data(), fault);
  // Backward from the reference's saved statistics, as the GPU test does.
  rb::emulate_batchnorm_backward(c.s, c.x.data(), c.dy.data(), c.gamma.data(), c.mean.data(),
                                 c.invstd.data(), e.dx.data(), e.dgamma.data(), e.dbeta.data(), fault);
  return e;
}

struct Outcome {
  std::size_t outside = 0;  // elements outside their bound, over all outputs
  double loosest_ulps = 0;  // the largest bound, in ulp of the reference value
};

Outcome check_all(const BatchNormCase& c, const Emulated& e, bool report) {
  const rb::ForwardTolerances ft =
      rb::forward_tolerances(c.s, c.x.data(), c.gamma.data(), c.beta.data(), c.eps, c.momentum, c.y,
                             c.rm, c.rv, c.mean, c.invstd);
  const rb::BackwardTolerances bt = rb::backward_tolerances(
      c.s, c.x.data(), c.dy.data(), c.gamma.data(), c.mean.data(), c.invstd.data(), c.dx, c.dgamma,
      c.dbeta);
  Outcome o;
  auto one = [&](const char* what, const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& bound) {
    const rb::Comparison cmp = rb::compare(got, want, bound);
    if (report) {
      INFO(shape_tag(c.s) << " " << what << ": " << cmp.describe(got, want, bound));
      CHECK(cmp.bad == 0);
    }
    o.outside += cmp.bad;
    if (cmp.worst_ulps > o.loosest_ulps) o.loosest_ulps = cmp.worst_ulps;
  };
  one("save_mean", e.mean, c.mean, ft.save_mean);
  one("save_invstd", e.invstd, c.invstd, ft.save_invstd);
  one("running_mean", e.rm, c.rm, ft.running_mean);
  one("running_var", e.rv, c.rv, ft.running_var);
  one("dgamma", e.dgamma, c.dgamma, bt.dgamma);
  one("dbeta", e.dbeta, c.dbeta, bt.dbeta);
  // The per-element outputs: bounds are about one ulp, except where y or dx cancels to
  // near zero (then the absolute part, some 1e-12 of the terms, is more ulps of a tiny
  // value). Their loosest bound is measured in absolute terms below.
  one("y", e.y, c.y, ft.y);
  one("dx", e.dx, c.dx, bt.dx);
  return o;
}

}  // namespace

TEST_CASE("the GPU's summation order (emulated) is within the derived bounds of ref::") {
  uint32_t seed = 40;
  for (const BatchNormShape& s : rb::ragged_shapes()) {
    const BatchNormCase c = make_case(s, seed++);
    const Emulated e = emulate(c, rb::Fault::None);
    const Outcome o = check_all(c, e, true);
    CHECK(o.outside == 0);
    // How often the order actually shows in the bits (the issue saw 1 element in 2.2 M).
    std::size_t differ = 0;
    for (std::size_t i = 0; i < c.y.size(); ++i) differ += (e.y[i] != c.y[i]) + (e.dx[i] != c.dx[i]);
    for (int ch = 0; ch < s.c; ++ch)
      differ += (e.mean[ch] != c.mean[ch]) + (e.invstd[ch] != c.invstd[ch]) + (e.dbeta[ch] != c.dbeta[ch]) +
                (e.dgamma[ch] != c.dgamma[ch]);
    MESSAGE(shape_tag(s) << ": " << differ << " of " << 2 * c.y.size() + 4 * s.c
                         << " outputs differ from ref:: in the bits (all within the bounds)");
    // The statistics and the per-channel sums could differ by 1 ulp at most, plus a
    // rounding-level excess; the bounds must say so (4 ulp would already be loose).
    const rb::ForwardTolerances ft =
        rb::forward_tolerances(c.s, c.x.data(), c.gamma.data(), c.beta.data(), c.eps, c.momentum,
                               c.y, c.rm, c.rv, c.mean, c.invstd);
    const rb::BackwardTolerances bt = rb::backward_tolerances(
        c.s, c.x.data(), c.dy.data(), c.gamma.data(), c.mean.data(), c.invstd.data(), c.dx,
        c.dgamma, c.dbeta);
    // The sums may be small by chance (then D is more ulps of a small value): most
    // channels within 2 ulp.
    int loose_sums = 0;
    for (int ch = 0; ch < s.c; ++ch) {
      INFO(shape_tag(s) << " channel " << ch);
      CHECK(ft.save_mean[ch] <= 1.01 * rb::ulp_float(c.mean[ch]));
      CHECK(ft.save_invstd[ch] <= 1.01 * rb::ulp_float(c.invstd[ch]));
      loose_sums += bt.dbeta[ch] > 2.0 * rb::ulp_float(c.dbeta[ch]) ? 1 : 0;
      loose_sums += bt.dgamma[ch] > 2.0 * rb::ulp_float(c.dgamma[ch]) ? 1 : 0;
    }
    CHECK(loose_sums * 10 <= 2 * s.c);
    // Per element: far below the old tolerances (1e-5 relative + 1e-5, 1e-4 of the
    // largest magnitude), and about one ulp for nearly every element.
    std::size_t loose_y = 0, loose_dx = 0;
    double max_y = 0, max_dx = 0;
    for (std::size_t i = 0; i < c.y.size(); ++i) {
      max_y = std::max(max_y, ft.y[i]);
      max_dx = std::max(max_dx, bt.dx[i]);
      loose_y += ft.y[i] > 2.0 * rb::ulp_float(c.y[i]) ? 1 : 0;
      loose_dx += bt.dx[i] > 2.0 * rb::ulp_float(c.dx[i]) ? 1 : 0;
    }
    INFO(shape_tag(s) << ": largest y bound " << max_y << ", dx bound " << max_dx << "; over 2 ulp: "
                      << loose_y << " y, " << loose_dx << " dx of " << c.y.size());
    CHECK(max_y < 1e-6);
    CHECK(max_dx < 1e-6);
    CHECK(loose_y * 100 < c.y.size());  // under 1 % of elements above 2 ulp
    CHECK(loose_dx * 100 < c.dx.size());
  }
}

TEST_CASE("a reduction that loses one element of a ragged slice falls outside the bounds") {
  uint32_t seed = 40;
  for (const BatchNormShape& s : rb::ragged_shapes()) {
    const BatchNormCase c = make_case(s, seed++);
    if (!ragged(s)) continue;
    INFO(shape_tag(s));
    for (rb::Fault fault : {rb::Fault::DropLastElementOfRaggedSlice, rb::Fault::FloorSliceLength}) {
      const Outcome o = check_all(c, emulate(c, fault), false);
      // Every channel's statistics and sums are off: at least one output per channel.
      CHECK(o.outside >= static_cast<std::size_t>(s.c));
    }
  }
}

TEST_CASE("a 4-ulp error in one output element is outside its bound") {
  const BatchNormCase c = make_case({88, 64, 196}, 7);
  const Emulated e = emulate(c, rb::Fault::None);
  const rb::ForwardTolerances ft = rb::forward_tolerances(
      c.s, c.x.data(), c.gamma.data(), c.beta.data(), c.eps, c.momentum, c.y, c.rm, c.rv, c.mean, c.invstd);
  int tried = 0;
  for (std::size_t i = 0; i < c.y.size() && tried < 50; i += 997) {
    if (ft.y[i] > 2.0 * rb::ulp_float(c.y[i])) continue;  // a near-zero output: skip
    std::vector<float> bad = e.y;
    float v = c.y[i];
    for (int k = 0; k < 4; ++k) v = std::nextafter(v, c.y[i] >= 0 ? INFINITY : -INFINITY);
    bad[i] = v;
    const rb::Comparison cmp = rb::compare(bad, c.y, ft.y);
    INFO("element " << i);
    CHECK(cmp.bad == 1);
    CHECK(cmp.first_bad == i);
    ++tried;
  }
  CHECK(tried == 50);
}

TEST_CASE("channel_sum in the GPU's order is within its bound, one lost element is not") {
  std::mt19937 rng(90);
  struct Case {
    int n, c;
    int64_t hw;
  };
  for (const Case& k : {Case{128, 64, 196}, Case{88, 32, 196}, Case{88, 10, 1}, Case{3, 5, 1025}}) {
    const auto x = uniform(static_cast<std::size_t>(k.n) * k.c * k.hw, rng, -1.0f, 1.0f);
    std::vector<float> want(k.c), got(k.c), faulty(k.c);
    // The reference's sum for a conv bias gradient: element order, in double.
    for (int ch = 0; ch < k.c; ++ch) {
      double acc = 0.0;
      for (int i = 0; i < k.n; ++i)
        for (int64_t j = 0; j < k.hw; ++j) acc += x[(static_cast<int64_t>(i) * k.c + ch) * k.hw + j];
      want[ch] = static_cast<float>(acc);
    }
    rb::emulate_channel_sum(k.n, k.c, k.hw, x.data(), got.data());
    const std::vector<double> bound = rb::channel_sum_tolerances(k.n, k.c, k.hw, x.data(), want);
    const rb::Comparison ok = rb::compare(got, want, bound);
    INFO("channel_sum n=" << k.n << " c=" << k.c << " hw=" << k.hw << ": " << ok.describe(got, want, bound));
    CHECK(ok.bad == 0);
    int loose = 0;
    for (int ch = 0; ch < k.c; ++ch) loose += bound[ch] > 2.0 * rb::ulp_float(want[ch]) ? 1 : 0;
    CHECK(loose * 10 <= k.c);
    const int64_t m = static_cast<int64_t>(k.n) * k.hw;
    if (m % engine::kernels::cuda::channel_slices(m) != 0) {
      rb::emulate_channel_sum(k.n, k.c, k.hw, x.data(), faulty.data(), rb::Fault::DropLastElementOfRaggedSlice);
      CHECK(rb::compare(faulty, want, bound).bad == static_cast<std::size_t>(k.c));
    }
  }
}
