// Finite-difference checks of every backward: the reference ops (engine::kernels::ref),
// the layers (engine::Layer, fast CPU kernels) and the whole FashionCnn, with the
// checker of tests/gradcheck.h. The checker itself is shown to reject gradients that
// are wrong by 1%, have two elements swapped, one zeroed or one sign-flipped.
//
// Losses are L = sum(y * r) for a fixed random r (dL/dy = r, so the backward op is fed
// dy = r), accumulated in double from the float outputs; for cross-entropy and the
// model, the batch-mean cross-entropy.
//
// Tolerances (gradcheck::Options: |num - ana| <= atol + atol_scale * max|ana| +
// rtol * max(|num|, |ana|)):
//  - Reference ops: h = 1e-2, rtol = 2e-3, atol_scale = 1e-3 (the defaults; see
//    gradcheck.h). The ops accumulate in double and round each output once, so the
//    numerical gradient is good to ~1e-5 relative (linear ops have no truncation error;
//    batchnorm and softmax ~h^2 = 1e-4 relative); a 1% error fails.
//  - Layers (fast float32 kernels, linear or smooth in each input once ReLU/max-pool
//    inputs are kept away from their kinks): the same h = 1e-2, rtol = 2e-3,
//    atol_scale = 1e-3. Float summation noise in L(x +- h) is ~1e-7 relative, ~1e-5 of
//    the gradient scale after dividing by 2h; the measured worst |diff|/tol is ~0.01.
//  - The whole model is float32 and not smooth: perturbing one conv1 weight moves ~25k
//    ReLU/max-pool inputs, and those crossing a kink within +-h bias the difference by
//    up to a few % of the tensor's gradient whatever h (smaller h trades kink error for
//    float noise). So the model is checked three ways: (1) the derivative along each
//    tensor's own gradient (the largest signal; rtol 2e-2, measured <= 6.7e-3 over 8
//    draws), (2) sampled elements with a coarse bound, (3) equality with the reference-op
//    chain, whose every backward is finite-difference checked here (tight: 1e-4).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/nn/layers.h"
#include "engine/core/rng.h"
#include "gradcheck.h"
#include "kernels/ops.h"
#include "engine/nn/models/fashion_cnn.h"
#include "support/random_data.h"

namespace {

// The per-step values the ops read from memory (StepValues): zero counter and first
// sample, loss scale 1.
const uint64_t kNoCounter = 0;
const int64_t kFirst0 = 0;
const float kScale1 = 1.0f;

namespace ref = engine::kernels::ref;
namespace cpu = engine::kernels::cpu;
using engine::kernels::BatchNormShape;
using engine::kernels::BatchSplit;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;
using engine::kernels::PoolShape;
using gradcheck::Options;
using gradcheck::Result;

using test_support::uniform;

#define CHECK_GRAD(name, result)                                        \
  do {                                                                  \
    const Result r_ = (result);                                         \
    if (std::getenv("GRADCHECK_VERBOSE"))                               \
      MESSAGE(gradcheck::describe(name, r_));                           \
    CHECK_MESSAGE(r_.ok(), gradcheck::describe(name, r_));              \
  } while (0)

// ---- conv2d --------------------------------------------------------------------
struct ConvProblem {
  ConvShape s;
  std::vector<float> x, w, b, r;
  explicit ConvProblem(const ConvShape& shape, uint32_t seed) : s(shape) {
    std::mt19937 g(seed);
    x = uniform(static_cast<std::size_t>(s.n) * s.c * s.h * s.w, g, -1.0f, 1.0f);
    w = uniform(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, g, -0.5f, 0.5f);
    b = uniform(static_cast<std::size_t>(s.k), g, -0.5f, 0.5f);
    r = uniform(static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w(), g, -1.0f, 1.0f);
  }
  double loss() const {
    std::vector<float> y(r.size());
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), y.data());
    return gradcheck::dot(y, r);
  }
};

// ---- linear --------------------------------------------------------------------
struct LinearProblem {
  LinearShape s;
  std::vector<float> x, w, b, r;
  explicit LinearProblem(const LinearShape& shape, uint32_t seed) : s(shape) {
    std::mt19937 g(seed);
    x = uniform(static_cast<std::size_t>(s.n) * s.in, g, -1.0f, 1.0f);
    w = uniform(static_cast<std::size_t>(s.out) * s.in, g, -0.5f, 0.5f);
    b = uniform(static_cast<std::size_t>(s.out), g, -0.5f, 0.5f);
    r = uniform(static_cast<std::size_t>(s.n) * s.out, g, -1.0f, 1.0f);
  }
  double loss() const {
    std::vector<float> y(r.size());
    ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), y.data());
    return gradcheck::dot(y, r);
  }
  void grads(std::vector<float>& dx, std::vector<float>& dw, std::vector<float>& db) const {
    dx.assign(x.size(), 0.0f);
    dw.assign(w.size(), 0.0f);
    db.assign(b.size(), 0.0f);
    ref::linear_backward(s, engine::Precision::Fp32, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
  }
};

}  // namespace

// ---------------------------------------------------------------------------------
// The checker rejects wrong gradients
// ---------------------------------------------------------------------------------
TEST_CASE("gradcheck accepts the right gradient and rejects slightly wrong ones") {
  LinearProblem p({3, 7, 5}, 11);
  std::vector<float> dx, dw, db;
  p.grads(dx, dw, db);
  auto loss = [&] { return p.loss(); };
  const int64_t nw = static_cast<int64_t>(dw.size());

  CHECK_GRAD("linear dw (correct)", gradcheck::check(loss, p.w.data(), nw, dw.data()));

  // Every element scaled by 1.01.
  std::vector<float> bad = dw;
  for (float& v : bad) v *= 1.01f;
  CHECK_FALSE(gradcheck::check(loss, p.w.data(), nw, bad.data()).ok());

  // Only the largest element scaled by 1.01.
  const std::size_t big = static_cast<std::size_t>(
      std::max_element(dw.begin(), dw.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
      dw.begin());
  bad = dw;
  bad[big] *= 1.01f;
  Result r = gradcheck::check(loss, p.w.data(), nw, bad.data());
  CHECK_FALSE(r.ok());
  CHECK(r.failures == 1);

  // Two elements swapped (chosen with clearly different values).
  bad = dw;
  std::size_t i = 0, j = 1;
  while (std::fabs(dw[i] - dw[j]) < 0.1f * std::fabs(dw[big])) ++j;
  std::swap(bad[i], bad[j]);
  r = gradcheck::check(loss, p.w.data(), nw, bad.data());
  CHECK_FALSE(r.ok());
  CHECK(r.failures == 2);

  // One element zeroed; one sign flipped.
  bad = dw;
  bad[big] = 0.0f;
  CHECK_FALSE(gradcheck::check(loss, p.w.data(), nw, bad.data()).ok());
  bad = dw;
  bad[big] = -bad[big];
  CHECK_FALSE(gradcheck::check(loss, p.w.data(), nw, bad.data()).ok());

  // The gradient of another loss (dy = r shifted by one element).
  std::vector<float> r_shift(p.r.size());
  for (std::size_t k = 0; k < r_shift.size(); ++k) r_shift[k] = p.r[(k + 1) % r_shift.size()];
  std::vector<float> dx2(dx.size()), dw2(dw.size()), db2(db.size());
  ref::linear_backward(p.s, engine::Precision::Fp32, p.x.data(), p.w.data(), r_shift.data(), dx2.data(), dw2.data(), db2.data());
  CHECK_FALSE(gradcheck::check(loss, p.x.data(), static_cast<int64_t>(dx.size()), dx2.data()).ok());

  // A NaN in the analytic gradient fails.
  bad = dw;
  bad[0] = NAN;
  CHECK_FALSE(gradcheck::check(loss, p.w.data(), nw, bad.data()).ok());

  // Subsets of big tensors: at most max_checks elements, the input restored exactly.
  ConvProblem c({2, 3, 9, 9, 4, 3, 3, 1}, 12);
  std::vector<float> cdx(c.x.size()), cdw(c.w.size()), cdb(c.b.size());
  ref::conv2d_backward(c.s, engine::Precision::Fp32, c.x.data(), c.w.data(), c.r.data(), cdx.data(), cdw.data(), cdb.data());
  const std::vector<float> x_before = c.x;
  Options o;
  o.max_checks = 50;
  r = gradcheck::check([&] { return c.loss(); }, c.x.data(), static_cast<int64_t>(c.x.size()), cdx.data(), o);
  CHECK(r.ok());
  CHECK(r.checked == 50);
  CHECK(c.x == x_before);
  for (float& v : cdx) v *= 1.01f;
  CHECK_FALSE(gradcheck::check([&] { return c.loss(); }, c.x.data(), static_cast<int64_t>(c.x.size()),
                               cdx.data(), o)
                  .ok());
}

// ---------------------------------------------------------------------------------
// Reference ops
// ---------------------------------------------------------------------------------
TEST_CASE("ref conv2d_backward: dx, dw, db match finite differences") {
  const ConvShape shapes[] = {
      {2, 3, 6, 5, 4, 3, 3, 1},  // pad 1
      {1, 2, 5, 7, 3, 2, 3, 0},  // pad 0, non-square kernel
      {3, 1, 4, 4, 2, 3, 1, 2},  // pad wider than the kernel
  };
  uint32_t seed = 100;
  for (const ConvShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.r);
    CAPTURE(s.s);
    CAPTURE(s.pad);
    ConvProblem p(s, seed++);
    std::vector<float> dx(p.x.size()), dw(p.w.size()), db(p.b.size());
    ref::conv2d_backward(s, engine::Precision::Fp32, p.x.data(), p.w.data(), p.r.data(), dx.data(), dw.data(), db.data());
    auto loss = [&] { return p.loss(); };
    CHECK_GRAD("conv dx", gradcheck::check(loss, p.x.data(), static_cast<int64_t>(dx.size()), dx.data()));
    CHECK_GRAD("conv dw", gradcheck::check(loss, p.w.data(), static_cast<int64_t>(dw.size()), dw.data()));
    CHECK_GRAD("conv db", gradcheck::check(loss, p.b.data(), static_cast<int64_t>(db.size()), db.data()));
  }
}

TEST_CASE("ref linear_backward: dx, dw, db match finite differences") {
  const LinearShape shapes[] = {{3, 7, 5}, {1, 4, 2}, {4, 31, 10}};
  uint32_t seed = 200;
  for (const LinearShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    LinearProblem p(s, seed++);
    std::vector<float> dx, dw, db;
    p.grads(dx, dw, db);
    auto loss = [&] { return p.loss(); };
    CHECK_GRAD("linear dx", gradcheck::check(loss, p.x.data(), static_cast<int64_t>(dx.size()), dx.data()));
    CHECK_GRAD("linear dw", gradcheck::check(loss, p.w.data(), static_cast<int64_t>(dw.size()), dw.data()));
    CHECK_GRAD("linear db", gradcheck::check(loss, p.b.data(), static_cast<int64_t>(db.size()), db.data()));
  }
}

TEST_CASE("ref batchnorm_backward (training mode): dx, dgamma, dbeta match finite differences") {
  const BatchNormShape shapes[] = {{3, 4, 6}, {2, 3, 5}, {5, 2, 1}};
  uint32_t seed = 300;
  for (const BatchNormShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.hw);
    std::mt19937 g(seed++);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.hw;
    std::vector<float> x = uniform(nx, g, -1.0f, 1.0f);
    for (std::size_t j = 0; j < nx; ++j) x[j] = 0.5f + 1.5f * x[j];
    std::vector<float> gamma = uniform(s.c, g, 0.5f, 1.5f), beta = uniform(s.c, g, -1.0f, 1.0f);
    const std::vector<float> r = uniform(nx, g, -1.0f, 1.0f);
    const float eps = 1e-5f;
    auto forward = [&](std::vector<float>& y, std::vector<float>& mean, std::vector<float>& invstd) {
      std::vector<float> rm(s.c, 0.0f), rv(s.c, 1.0f);
      y.assign(nx, 0.0f);
      mean.assign(s.c, 0.0f);
      invstd.assign(s.c, 0.0f);
      ref::batchnorm_forward_train(s, BatchSplit{}, x.data(), gamma.data(), beta.data(), eps, 0.1f, rm.data(),
                                   rv.data(), mean.data(), invstd.data(), y.data());
    };
    auto loss = [&] {
      std::vector<float> y, mean, invstd;
      forward(y, mean, invstd);
      return gradcheck::dot(y, r);
    };
    std::vector<float> y, mean, invstd;
    forward(y, mean, invstd);
    std::vector<float> dx(nx), dgamma(s.c), dbeta(s.c);
    ref::batchnorm_backward(s, BatchSplit{}, x.data(), r.data(), gamma.data(), mean.data(), invstd.data(), dx.data(),
                            dgamma.data(), dbeta.data());
    CHECK_GRAD("bn dx", gradcheck::check(loss, x.data(), static_cast<int64_t>(nx), dx.data()));
    CHECK_GRAD("bn dgamma", gradcheck::check(loss, gamma.data(), s.c, dgamma.data()));
    CHECK_GRAD("bn dbeta", gradcheck::check(loss, beta.data(), s.c, dbeta.data()));
  }
}

TEST_CASE("ref relu_backward matches finite differences (inputs away from 0)") {
  std::mt19937 g(400);
  const std::size_t n = 150;
  std::vector<float> x = uniform(n, g, 0.1f, 2.0f);
  for (std::size_t i = 0; i < n; i += 2) x[i] = -x[i];
  const std::vector<float> r = uniform(n, g, -1.0f, 1.0f);
  auto loss = [&] {
    std::vector<float> y(n);
    ref::relu_forward(static_cast<int64_t>(n), x.data(), y.data());
    return gradcheck::dot(y, r);
  };
  std::vector<float> y(n), dx(n);
  ref::relu_forward(static_cast<int64_t>(n), x.data(), y.data());
  ref::relu_backward(static_cast<int64_t>(n), y.data(), r.data(), dx.data());
  CHECK_GRAD("relu dx", gradcheck::check(loss, x.data(), static_cast<int64_t>(n), dx.data()));
}

TEST_CASE("ref maxpool2x2_backward matches finite differences (distinct window values)") {
  std::mt19937 g(500);
  const PoolShape shapes[] = {{2, 3, 4, 6}, {1, 1, 2, 2}, {3, 2, 6, 2}};
  for (const PoolShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.h);
    CAPTURE(s.w);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w, ny = nx / 4;
    // Each window holds base + a permutation of {0, 0.1, 0.2, 0.3}: the maximum is unique
    // and stays so under perturbations of +-h = 1e-2.
    std::vector<float> x(nx);
    std::uniform_real_distribution<float> base(-1.0f, 1.0f);
    for (int nc = 0; nc < s.n * s.c; ++nc)
      for (int oh = 0; oh < s.h / 2; ++oh)
        for (int ow = 0; ow < s.w / 2; ++ow) {
          float offs[4] = {0.0f, 0.1f, 0.2f, 0.3f};
          std::shuffle(offs, offs + 4, g);
          const float b = base(g);
          for (int d = 0; d < 4; ++d)
            x[(static_cast<std::size_t>(nc) * s.h + 2 * oh + d / 2) * s.w + 2 * ow + d % 2] = b + offs[d];
        }
    const std::vector<float> r = uniform(ny, g, -1.0f, 1.0f);
    auto loss = [&] {
      std::vector<float> y(ny);
      std::vector<int32_t> am(ny);
      ref::maxpool2x2_forward(s, x.data(), y.data(), am.data());
      return gradcheck::dot(y, r);
    };
    std::vector<float> y(ny), dx(nx);
    std::vector<int32_t> am(ny);
    ref::maxpool2x2_forward(s, x.data(), y.data(), am.data());
    ref::maxpool2x2_backward(s, r.data(), am.data(), dx.data());
    CHECK_GRAD("maxpool dx", gradcheck::check(loss, x.data(), static_cast<int64_t>(nx), dx.data()));
  }
}

TEST_CASE("ref dropout_backward matches finite differences (fixed mask)") {
  std::mt19937 g(600);
  const int64_t n = 180;
  const engine::PhiloxStream stream{77, 3};
  for (const float p : {0.0f, 0.3f, 0.75f}) {
    CAPTURE(p);
    std::vector<float> x = uniform(static_cast<std::size_t>(n), g, -1.0f, 1.0f);
    const std::vector<float> r = uniform(static_cast<std::size_t>(n), g, -1.0f, 1.0f);
    // Same stream and offset on every call: the mask is fixed.
    auto loss = [&] {
      std::vector<float> y(static_cast<std::size_t>(n));
      std::vector<uint8_t> keep(static_cast<std::size_t>(n));
      ref::dropout_forward(n, x.data(), p, stream, &kNoCounter, 5, y.data(), keep.data());
      return gradcheck::dot(y, r);
    };
    std::vector<float> y(static_cast<std::size_t>(n)), dx(static_cast<std::size_t>(n));
    std::vector<uint8_t> keep(static_cast<std::size_t>(n));
    ref::dropout_forward(n, x.data(), p, stream, &kNoCounter, 5, y.data(), keep.data());
    ref::dropout_backward(n, r.data(), keep.data(), p, dx.data());
    CHECK_GRAD("dropout dx", gradcheck::check(loss, x.data(), n, dx.data()));
  }
}

TEST_CASE("ref cross_entropy dlogits (grad_scale 1) is the gradient of the batch-mean loss") {
  std::mt19937 g(700);
  struct Case {
    int n, classes;
  };
  for (const Case cs : {Case{4, 10}, Case{1, 10}, Case{7, 3}}) {
    CAPTURE(cs.n);
    CAPTURE(cs.classes);
    std::vector<float> z = uniform(static_cast<std::size_t>(cs.n) * cs.classes, g, -3.0f, 3.0f);
    std::vector<int32_t> labels(cs.n);
    std::uniform_int_distribution<int32_t> lab(0, cs.classes - 1);
    for (auto& l : labels) l = lab(g);
    auto loss = [&] {
      std::vector<float> l(cs.n), c(cs.n);
      ref::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), &kScale1, &kFirst0, nullptr, l.data(), c.data());
      double sum = 0.0;
      for (float v : l) sum += v;
      return sum / cs.n;
    };
    std::vector<float> l(cs.n), c(cs.n), d(z.size());
    ref::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), &kScale1, &kFirst0, d.data(), l.data(), c.data());
    CHECK_GRAD("cross_entropy dlogits", gradcheck::check(loss, z.data(), static_cast<int64_t>(z.size()), d.data()));
  }
}

// ---------------------------------------------------------------------------------
// Layers (fast CPU kernels through engine::Layer)
// ---------------------------------------------------------------------------------
namespace {

engine::Tensor tensor_of(const engine::Shape& shape, const std::vector<float>& v) {
  return engine::Tensor::from_vector(shape, v);
}

// Layer tolerance: float32 kernels, smooth or linear in each input (see top).
Options layer_options() {
  Options o;
  o.h = 1e-2;
  o.rtol = 2e-3;
  o.atol_scale = 1e-3;
  o.max_checks = 60;
  return o;
}

// Checks a layer's input gradient and every parameter gradient for L = sum(y * r).
// `rng_for_forward` returns the RNG each forward uses (a fresh copy keeps a Dropout mask
// fixed).
void check_layer(engine::Layer& layer, const engine::Shape& in_shape, uint32_t seed,
                 const std::function<engine::Rng()>& rng_for_forward, float x_lo = -1.0f,
                 float x_hi = 1.0f) {
  std::mt19937 g(seed);
  const std::size_t nx = static_cast<std::size_t>(engine::shape_numel(in_shape));
  engine::Tensor x = tensor_of(in_shape, uniform(nx, g, x_lo, x_hi));
  engine::Rng rng0 = rng_for_forward();
  engine::Tensor y0 = layer.forward(x, engine::Mode::Train, rng0);
  const engine::Shape out_shape = y0.shape();
  const std::vector<float> r = uniform(static_cast<std::size_t>(y0.numel()), g, -1.0f, 1.0f);
  // Analytic gradients first: backward reads what the last forward cached.
  const engine::Tensor dx_t = layer.backward(tensor_of(out_shape, r), engine::InputGrad::Needed);
  const std::vector<float> dx = dx_t.to_vector();
  std::vector<std::vector<float>> pgrads;
  for (engine::Parameter* p : layer.parameters()) pgrads.push_back(p->grad.to_vector());

  auto loss = [&] {
    engine::Rng rng = rng_for_forward();
    const engine::Tensor y = layer.forward(x, engine::Mode::Train, rng);
    return gradcheck::dot(y.to_vector(), r);
  };
  const Options o = layer_options();
  CHECK_GRAD(layer.name() + " dx", gradcheck::check(loss, x.f32(), x.numel(), dx.data(), o));
  std::size_t i = 0;
  for (engine::Parameter* p : layer.parameters()) {
    CHECK_GRAD(p->name, gradcheck::check(loss, p->value.f32(), p->value.numel(), pgrads[i].data(), o));
    ++i;
  }
}

engine::Rng fixed_rng() {
  engine::Rng rng(2024);
  rng.take(engine::RngStream::Dropout, 3);  // a non-zero, non-multiple-of-4 position
  return rng;
}

}  // namespace

TEST_CASE("layers: backward matches finite differences (fast CPU kernels)") {
  SUBCASE("Conv2d") {
    engine::Conv2d conv("conv", 3, 4, 3, 1);
    engine::Rng init(5);
    conv.reset_parameters(init);
    check_layer(conv, {2, 3, 6, 5}, 1, fixed_rng);
  }
  SUBCASE("Conv2d, 1 input channel (first layer shape)") {
    engine::Conv2d conv("conv1", 1, 5, 3, 1);
    engine::Rng init(6);
    conv.reset_parameters(init);
    check_layer(conv, {3, 1, 8, 8}, 2, fixed_rng);
  }
  SUBCASE("BatchNorm2d (training mode)") {
    engine::BatchNorm2d bn("bn", 3);
    std::mt19937 g(7);
    auto params = bn.parameters();
    params[0]->value.copy_from(tensor_of({3}, uniform(3, g, 0.5f, 1.5f)));
    params[1]->value.copy_from(tensor_of({3}, uniform(3, g, -1.0f, 1.0f)));
    check_layer(bn, {4, 3, 3, 5}, 3, fixed_rng, -1.0f, 2.0f);
  }
  SUBCASE("ReLU") {
    engine::ReLU relu("relu");
    // Inputs in [-1, 1] may land within h of 0; use inputs bounded away from the kink.
    std::mt19937 g(8);
    engine::Rng rng = fixed_rng();
    std::vector<float> xv = uniform(60, g, 0.1f, 1.0f);
    for (std::size_t i = 0; i < xv.size(); i += 3) xv[i] = -xv[i];
    engine::Tensor x = tensor_of({3, 20}, xv);
    const std::vector<float> r = uniform(60, g, -1.0f, 1.0f);
    relu.forward(x, engine::Mode::Train, rng);
    const std::vector<float> dx = relu.backward(tensor_of({3, 20}, r), engine::InputGrad::Needed).to_vector();
    auto loss = [&] {
      engine::Rng rr = fixed_rng();
      return gradcheck::dot(relu.forward(x, engine::Mode::Train, rr).to_vector(), r);
    };
    CHECK_GRAD("relu dx", gradcheck::check(loss, x.f32(), x.numel(), dx.data(), layer_options()));
  }
  SUBCASE("MaxPool2x2") {
    engine::MaxPool2x2 pool("pool");
    std::mt19937 g(9);
    const engine::Shape shape{2, 2, 4, 6};
    std::vector<float> xv(static_cast<std::size_t>(engine::shape_numel(shape)));
    // Distinct values 0.05 apart in a shuffled order: no ties within +-h.
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = 0.05f * static_cast<float>(i) - 2.0f;
    std::shuffle(xv.begin(), xv.end(), g);
    engine::Tensor x = tensor_of(shape, xv);
    engine::Rng rng = fixed_rng();
    const engine::Tensor y0 = pool.forward(x, engine::Mode::Train, rng);
    const std::vector<float> r = uniform(static_cast<std::size_t>(y0.numel()), g, -1.0f, 1.0f);
    const std::vector<float> dx = pool.backward(tensor_of(y0.shape(), r), engine::InputGrad::Needed).to_vector();
    auto loss = [&] {
      engine::Rng rr = fixed_rng();
      return gradcheck::dot(pool.forward(x, engine::Mode::Train, rr).to_vector(), r);
    };
    CHECK_GRAD("maxpool dx", gradcheck::check(loss, x.f32(), x.numel(), dx.data(), layer_options()));
  }
  SUBCASE("Flatten") {
    engine::Flatten flatten("flatten");
    check_layer(flatten, {2, 3, 2, 2}, 10, fixed_rng);
  }
  SUBCASE("Dropout p = 0.4 (mask fixed by a fresh RNG per forward)") {
    engine::Dropout dropout("dropout", 0.4f);
    check_layer(dropout, {4, 30}, 11, fixed_rng);
  }
  SUBCASE("Linear") {
    engine::Linear fc("fc", 31, 10);
    engine::Rng init(12);
    fc.reset_parameters(init);
    check_layer(fc, {4, 31}, 12, fixed_rng);
  }
  SUBCASE("Linear, first layer (input gradient not needed)") {
    engine::Linear fc("fc", 6, 3);
    engine::Rng init(13);
    fc.reset_parameters(init);
    std::mt19937 g(13);
    engine::Tensor x = tensor_of({2, 6}, uniform(12, g, -1.0f, 1.0f));
    engine::Rng rng = fixed_rng();
    fc.forward(x, engine::Mode::Train, rng);
    const std::vector<float> r = uniform(6, g, -1.0f, 1.0f);
    const engine::Tensor dx = fc.backward(tensor_of({2, 3}, r), engine::InputGrad::NotNeeded);
    CHECK_FALSE(dx.defined());
    auto* w = fc.parameters()[0];
    const std::vector<float> dw = w->grad.to_vector();
    auto loss = [&] {
      engine::Rng rr = fixed_rng();
      return gradcheck::dot(fc.forward(x, engine::Mode::Train, rr).to_vector(), r);
    };
    CHECK_GRAD("fc.weight (dx not needed)", gradcheck::check(loss, w->value.f32(), w->value.numel(), dw.data(), layer_options()));
  }
}

// ---------------------------------------------------------------------------------
// The whole model
// ---------------------------------------------------------------------------------
#ifndef GRADCHECK_MODEL_SEED
#define GRADCHECK_MODEL_SEED 0  // change to re-run the model checks on other draws
#endif

namespace {

// FashionCnn(p = 0: a deterministic function) with PyTorch's initialisation, BatchNorm
// affine parameters moved away from (1, 0), a batch of 4 inputs and labels. The loss is
// the batch-mean cross-entropy, in double from the float logits, BatchNorm in training mode.
struct ModelProblem {
  static constexpr int n = 4, classes = engine::FashionCnn::kClasses;
  engine::FashionCnn model{0.0f};
  engine::Rng rng{31337 + GRADCHECK_MODEL_SEED};
  engine::Tensor x;
  std::vector<int32_t> labels{3, 7, 0, 9};

  ModelProblem() {
    model.reset_parameters(rng);
    std::mt19937 g(42 + GRADCHECK_MODEL_SEED);
    for (engine::Parameter* p : model.parameters())
      if (p->name.rfind("bn", 0) == 0) {
        const bool weight = p->name.find("weight") != std::string::npos;
        p->value.copy_from(tensor_of(p->value.shape(),
                                     uniform(static_cast<std::size_t>(p->value.numel()), g,
                                             weight ? 0.5f : -0.5f, weight ? 1.5f : 0.5f)));
      }
    x = tensor_of({n, 1, 28, 28}, uniform(static_cast<std::size_t>(n) * 28 * 28, g, -1.0f, 2.0f));
  }

  static double mean_cross_entropy(const std::vector<float>& z, const std::vector<int32_t>& labels) {
    double total = 0.0;
    for (int i = 0; i < n; ++i) {
      const float* zi = z.data() + static_cast<std::size_t>(i) * classes;
      const double zmax = *std::max_element(zi, zi + classes);
      double s = 0.0;
      for (int k = 0; k < classes; ++k) s += std::exp(zi[k] - zmax);
      total += zmax + std::log(s) - zi[labels[i]];
    }
    return total / n;
  }
  double loss() { return mean_cross_entropy(model.forward(x, engine::Mode::Train, rng).to_vector(), labels); }

  // Forward, dlogits of the batch-mean loss (grad_scale 1), backward; returns the
  // logits and leaves the gradients in the parameters' .grad.
  std::vector<float> forward_backward() {
    const std::vector<float> z = model.forward(x, engine::Mode::Train, rng).to_vector();
    std::vector<float> dl(z.size()), sl(n), sc(n);
    cpu::cross_entropy(n, n, classes, z.data(), labels.data(), &kScale1, &kFirst0, dl.data(), sl.data(), sc.data());
    model.backward(tensor_of({n, classes}, dl));
    return z;
  }
};

}  // namespace

// Per-tensor check: the derivative of the loss along the tensor's own analytic gradient
// (all elements moved at once, step chosen so the loss moves by ~1e-4) must equal |g|^2
// per unit step. This is the largest signal a finite difference can get, so it is
// accurate despite the model's kinks: measured over 8 draws of parameters and inputs,
// the relative error stays below 7e-3 (the loss noise, ~1e-7 of 2.3, is 2e-3 of the
// 1e-4 change; ReLU/max-pool switches inside the step the rest). rtol = 2e-2 therefore
// rejects any tensor gradient scaled by 1.03 or more, of the wrong sign, or belonging to
// another tensor. (It cannot see errors orthogonal to the gradient, such as some
// elements zeroed: the per-element and reference-chain checks below cover those.)
TEST_CASE("FashionCnn: each parameter's gradient matches the directional finite difference") {
  ModelProblem mp;
  mp.forward_backward();
  double max_norm = 0.0;
  std::vector<double> norms;
  for (engine::Parameter* p : mp.model.parameters()) {
    double sq = 0.0;
    for (float v : p->grad.to_vector()) sq += static_cast<double>(v) * v;
    norms.push_back(std::sqrt(sq));
    max_norm = std::max(max_norm, norms.back());
  }
  REQUIRE(max_norm > 0.0);
  std::size_t i = 0;
  for (engine::Parameter* p : mp.model.parameters()) {
    CAPTURE(p->name);
    const std::vector<float> g = p->grad.to_vector();
    const double norm = norms[i++];
    if (p->name == "conv1.bias" || p->name == "conv2.bias") {
      // Training-mode BatchNorm subtracts the batch mean: the loss does not depend on the
      // preceding conv bias at all. Its gradient is ~0, and a large random shift of the
      // bias leaves the loss unchanged up to float noise.
      CHECK(norm <= 1e-6 * max_norm);
      std::mt19937 gd(7);
      std::normal_distribution<double> nd;
      std::vector<double> d(g.size());
      for (double& v : d) v = nd(gd);
      const gradcheck::Directional r =
          gradcheck::directional([&] { return mp.loss(); }, p->value.f32(), p->value.numel(), g.data(), d, 0.1);
      CHECK(std::fabs(r.numeric) <= 1e-5);
      continue;
    }
    REQUIRE(norm > 1e-3 * max_norm);
    std::vector<double> d(g.size());
    for (std::size_t k = 0; k < g.size(); ++k) d[k] = g[k] / norm;
    const double step = 1e-4 / norm;  // the loss moves by ~1e-4 each way
    const gradcheck::Directional r =
        gradcheck::directional([&] { return mp.loss(); }, p->value.f32(), p->value.numel(), g.data(), d, step);
    if (std::getenv("GRADCHECK_VERBOSE"))
      MESSAGE(p->name << ": directional numeric " << r.numeric << " analytic " << r.analytic
                      << " rel error " << r.rel_error());
    CHECK_MESSAGE(r.rel_error() <= 2e-2, p->name << ": directional numeric " << r.numeric
                                                << " analytic " << r.analytic);
  }
}

// Per-element check on the largest-gradient element and 5 random ones of every tensor.
// Through the whole float32 model an element's central difference is limited by the
// kinks: a single conv1 weight feeds ~25k ReLU/max-pool decisions, and those that switch
// inside +-h bias the difference. Measured over 8 draws at h = 1e-3: up to ~2% of the
// tensor's largest gradient (beyond 2% of the element's own) for conv1/bn1/conv2/bn2,
// ~1e-4 for the fully connected layers; h = 1e-2 is ~2x worse, and below h = 3e-4 the
// loss's float noise (~1e-7 / 2h) takes over. Hence h = 1e-3 and
//   |num - ana| <= 5e-2 |ana| + 5e-2 max_t |g| + 1e-3 max_model |g|
// (worst measured |diff|/tol: 0.45): a coarse check of every element's sign, scale and
// wiring; the fine ones are the directional check above, the reference-chain check below
// and the layer-level checks.
TEST_CASE("FashionCnn: sampled gradient elements match central differences (coarse)") {
  ModelProblem mp;
  mp.forward_backward();
  std::vector<std::vector<float>> grads;
  double gmax_model = 0.0;
  for (engine::Parameter* p : mp.model.parameters()) {
    grads.push_back(p->grad.to_vector());
    for (float v : grads.back()) gmax_model = std::max(gmax_model, static_cast<double>(std::fabs(v)));
  }
  std::size_t i = 0;
  for (engine::Parameter* p : mp.model.parameters()) {
    const std::vector<float>& g = grads[i];
    const int64_t n = p->value.numel();
    int64_t imax = 0;
    double gmax = 0.0;
    for (int64_t k = 0; k < n; ++k)
      if (std::fabs(g[k]) > gmax) gmax = std::fabs(g[k]), imax = k;
    std::vector<int64_t> idx = gradcheck::pick_indices(n, 6, 2000 + static_cast<uint32_t>(i));
    if (std::find(idx.begin(), idx.end(), imax) == idx.end()) idx[0] = imax;
    Options o;
    o.h = 1e-3;
    o.rtol = 5e-2;
    o.atol = 1e-3 * gmax_model;
    o.atol_scale = 5e-2;
    CHECK_GRAD(p->name, gradcheck::check_indices([&] { return mp.loss(); }, p->value.f32(), n, g.data(), idx, o));
    ++i;
  }
}

// The model's gradients (fast kernels through the layers) equal those of the same network
// written out with the reference ops, each of whose backward is finite-difference checked
// above: this pins every element, which finite differences through the kinks cannot.
// Differences come only from float vs double accumulation (~1e-6 relative per op; no
// ReLU/max-pool decision flips at that level), so the tolerance is tight: 1e-4 of each
// tensor's largest gradient, plus 1e-6 of the model's for the ~0 conv-bias gradients
// (measured over 8 draws: at most 1% of that tolerance, 12% for the conv biases).
TEST_CASE("FashionCnn: gradients equal the reference-op chain (forward and backward)") {
  ModelProblem mp;
  const std::vector<float> z_model = mp.forward_backward();
  std::map<std::string, std::vector<float>> value, grad;
  for (engine::Parameter* p : mp.model.parameters()) {
    value[p->name] = p->value.to_vector();
    grad[p->name] = p->grad.to_vector();
  }
  const int n = ModelProblem::n;
  const std::vector<float> x = mp.x.to_vector();
  const ConvShape c1{n, 1, 28, 28, 32, 3, 3, 1}, c2{n, 32, 14, 14, 64, 3, 3, 1};
  const BatchNormShape b1{n, 32, 28 * 28}, b2{n, 64, 14 * 14};
  const PoolShape p1{n, 32, 28, 28}, p2{n, 64, 14, 14};
  const LinearShape f1{n, 3136, 128}, f2{n, 128, 10};
  auto vec = [](int64_t size) { return std::vector<float>(static_cast<std::size_t>(size)); };
  const float eps = 1e-5f, momentum = 0.1f;

  // Forward.
  auto y1 = vec(n * 32 * 784), y2 = vec(n * 32 * 784), y3 = vec(n * 32 * 784), y4 = vec(n * 32 * 196);
  auto y5 = vec(n * 64 * 196), y6 = vec(n * 64 * 196), y7 = vec(n * 64 * 196), y8 = vec(n * 64 * 49);
  auto y9 = vec(n * 128), y10 = vec(n * 128), z = vec(n * 10);
  std::vector<int32_t> am1(y4.size()), am2(y8.size());
  auto rm1 = vec(32), rv1 = vec(32), sm1 = vec(32), si1 = vec(32);
  auto rm2 = vec(64), rv2 = vec(64), sm2 = vec(64), si2 = vec(64);
  ref::conv2d_forward(c1, engine::Precision::Fp32, BatchSplit{}, x.data(), value["conv1.weight"].data(), value["conv1.bias"].data(), y1.data());
  ref::batchnorm_forward_train(b1, BatchSplit{}, y1.data(), value["bn1.weight"].data(), value["bn1.bias"].data(), eps,
                               momentum, rm1.data(), rv1.data(), sm1.data(), si1.data(), y2.data());
  ref::relu_forward(static_cast<int64_t>(y2.size()), y2.data(), y3.data());
  ref::maxpool2x2_forward(p1, y3.data(), y4.data(), am1.data());
  ref::conv2d_forward(c2, engine::Precision::Fp32, BatchSplit{}, y4.data(), value["conv2.weight"].data(), value["conv2.bias"].data(), y5.data());
  ref::batchnorm_forward_train(b2, BatchSplit{}, y5.data(), value["bn2.weight"].data(), value["bn2.bias"].data(), eps,
                               momentum, rm2.data(), rv2.data(), sm2.data(), si2.data(), y6.data());
  ref::relu_forward(static_cast<int64_t>(y6.size()), y6.data(), y7.data());
  ref::maxpool2x2_forward(p2, y7.data(), y8.data(), am2.data());
  ref::linear_forward(f1, engine::Precision::Fp32, BatchSplit{}, y8.data(), value["fc1.weight"].data(), value["fc1.bias"].data(), y9.data());
  ref::relu_forward(static_cast<int64_t>(y9.size()), y9.data(), y10.data());
  ref::linear_forward(f2, engine::Precision::Fp32, BatchSplit{}, y10.data(), value["fc2.weight"].data(), value["fc2.bias"].data(), z.data());
  double zscale = 0.0;
  for (float v : z) zscale = std::max(zscale, static_cast<double>(std::fabs(v)));
  for (std::size_t k = 0; k < z.size(); ++k)
    CHECK(z_model[k] == doctest::Approx(z[k]).epsilon(1e-4).scale(zscale));

  // Backward.
  auto dz = vec(n * 10), sl = vec(n), sc = vec(n);
  ref::cross_entropy(n, n, 10, z.data(), mp.labels.data(), &kScale1, &kFirst0, dz.data(), sl.data(), sc.data());
  std::map<std::string, std::vector<float>> want;
  for (const auto& kv : value) want[kv.first] = vec(static_cast<int64_t>(kv.second.size()));
  auto d10 = vec(n * 128), d9 = vec(n * 128), d8 = vec(n * 3136), d7 = vec(n * 64 * 196), d6 = vec(n * 64 * 196);
  auto d5 = vec(n * 64 * 196), d4 = vec(n * 32 * 196), d3 = vec(n * 32 * 784), d2 = vec(n * 32 * 784), d1 = vec(n * 32 * 784);
  ref::linear_backward(f2, engine::Precision::Fp32, y10.data(), value["fc2.weight"].data(), dz.data(), d10.data(),
                       want["fc2.weight"].data(), want["fc2.bias"].data());
  ref::relu_backward(static_cast<int64_t>(d10.size()), y10.data(), d10.data(), d9.data());
  ref::linear_backward(f1, engine::Precision::Fp32, y8.data(), value["fc1.weight"].data(), d9.data(), d8.data(),
                       want["fc1.weight"].data(), want["fc1.bias"].data());
  ref::maxpool2x2_backward(p2, d8.data(), am2.data(), d7.data());
  ref::relu_backward(static_cast<int64_t>(d7.size()), y7.data(), d7.data(), d6.data());
  ref::batchnorm_backward(b2, BatchSplit{}, y5.data(), d6.data(), value["bn2.weight"].data(), sm2.data(), si2.data(),
                          d5.data(), want["bn2.weight"].data(), want["bn2.bias"].data());
  ref::conv2d_backward(c2, engine::Precision::Fp32, y4.data(), value["conv2.weight"].data(), d5.data(), d4.data(),
                       want["conv2.weight"].data(), want["conv2.bias"].data());
  ref::maxpool2x2_backward(p1, d4.data(), am1.data(), d3.data());
  ref::relu_backward(static_cast<int64_t>(d3.size()), y3.data(), d3.data(), d2.data());
  ref::batchnorm_backward(b1, BatchSplit{}, y1.data(), d2.data(), value["bn1.weight"].data(), sm1.data(), si1.data(),
                          d1.data(), want["bn1.weight"].data(), want["bn1.bias"].data());
  ref::conv2d_backward(c1, engine::Precision::Fp32, x.data(), value["conv1.weight"].data(), d1.data(), nullptr,
                       want["conv1.weight"].data(), want["conv1.bias"].data());

  double gmax_model = 0.0;
  for (const auto& kv : want)
    for (float v : kv.second) gmax_model = std::max(gmax_model, static_cast<double>(std::fabs(v)));
  for (const auto& kv : want) {
    const std::vector<float>& w = kv.second;
    const std::vector<float>& got = grad[kv.first];
    double gmax = 0.0, worst = 0.0;
    for (float v : w) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
    int bad = 0;
    std::size_t first = 0;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const double tol = 1e-4 * gmax + 1e-6 * gmax_model;
      const double err = std::fabs(static_cast<double>(got[k]) - w[k]);
      worst = std::max(worst, err / tol);
      if (!(err <= tol) && bad++ == 0) first = k;
    }
    if (std::getenv("GRADCHECK_VERBOSE")) MESSAGE(kv.first << ": max |model - ref| / tol " << worst);
    CHECK_MESSAGE(bad == 0, kv.first << ": " << bad << " of " << w.size() << " gradient elements differ; first ["
                                     << first << "] model " << got[first] << " reference chain " << w[first]);
  }
}

// On the CPU the op facade runs the fp32 kernels whatever the precision (fp16 and bf16
// ops are CUDA only), so a model set to Fp16 or Bf16 computes exactly what the Fp32 model
// does.
TEST_CASE("FashionCnn on the CPU: Fp16 and Bf16 precision give the Fp32 bits") {
  for (const engine::Precision p : {engine::Precision::Fp16, engine::Precision::Bf16}) {
    CAPTURE(static_cast<int>(p));
    ModelProblem fp32, low;
    low.model.set_precision(p);
    const std::vector<float> z32 = fp32.forward_backward(), z16 = low.forward_backward();
    CHECK(std::memcmp(z16.data(), z32.data(), z32.size() * sizeof(float)) == 0);
    const std::vector<engine::Parameter*> p32 = fp32.model.parameters(), p16 = low.model.parameters();
    REQUIRE(p32.size() == p16.size());
    for (std::size_t i = 0; i < p32.size(); ++i) {
      CAPTURE(p32[i]->name);
      const std::vector<float> g32 = p32[i]->grad.to_vector(), g16 = p16[i]->grad.to_vector();
      REQUIRE(g16.size() == g32.size());
      CHECK(std::memcmp(g16.data(), g32.data(), g32.size() * sizeof(float)) == 0);
    }
  }
}
