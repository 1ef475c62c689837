// Optimizer, scheduler and loss-scaler against hand-computed / PyTorch-computed values.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "engine/nn/optimizer.h"
#include "engine/nn/scaler.h"
#include "engine/nn/scheduler.h"

using namespace engine;

namespace {

struct OneParam {
  Parameter p{"w", Tensor::from_vector({3}, {1.0f, -2.0f, 0.5f}), Tensor::zeros({3})};
  void set_grad(std::vector<float> g) { p.grad = Tensor::from_vector({3}, g); }
};

const std::vector<std::vector<float>> kGrads = {{0.5f, -1.0f, 0.0f}, {0.25f, 2.0f, -3.0f}, {-0.125f, 0.5f, 1e-3f}};

// Reference Adam/AdamW in double, straight from the equations of the issue.
std::vector<double> adam_reference(bool decoupled, int steps) {
  std::vector<double> p = {1.0, -2.0, 0.5}, m(3, 0.0), v(3, 0.0);
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  for (int t = 1; t <= steps; ++t)
    for (int i = 0; i < 3; ++i) {
      double g = kGrads[t - 1][i];
      if (decoupled) p[i] -= lr * wd * p[i];
      else g += wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      p[i] -= lr / (1 - std::pow(b1, t)) * m[i] / (std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
    }
  return p;
}

void check_against(const char* name, const std::vector<std::vector<double>>& torch_values) {
  OneParam w;
  AdamOptimizer opt(name, {&w.p}, 0.1, 0.9, 0.999, 1e-8, 0.01);
  for (int t = 0; t < 3; ++t) {
    w.set_grad(kGrads[t]);
    opt.step();
    const auto got = w.p.value.to_vector();
    const auto ref = adam_reference(std::string(name) == "adamw", t + 1);
    for (int i = 0; i < 3; ++i) {
      CAPTURE(t);
      CAPTURE(i);
      // float32 arithmetic vs the double equations: a few float ulps.
      CHECK(std::fabs(got[i] - ref[i]) <= 4e-7 * std::max(1.0, std::fabs(ref[i])));
      // PyTorch 1.13 (CPU, float32) printed these; it uses m*b1 + (1-b1)*g where the
      // engine follows current PyTorch's lerp, so a couple of ulps may differ.
      CHECK(std::fabs(got[i] - torch_values[t][i]) <= 4e-7 * std::max(1.0, std::fabs(torch_values[t][i])));
    }
  }
  const StateDict s = opt.state();
  CHECK(s.get_int("step/w") == 3);
  CHECK(s.get_string("name") == name);
}

}  // namespace

TEST_CASE("AdamW matches the equations and PyTorch over three steps") {
  check_against("adamw", {{0.8990000486373901, -1.8980000019073486, 0.49950000643730164},
                          {0.8048830628395081, -1.932712435722351, 0.5734142065048218},
                          {0.7477120161056519, -1.9723448753356934, 0.6303415298461914}});
}

TEST_CASE("Adam (L2 decay in the gradient) matches the equations and PyTorch") {
  check_against("adam", {{0.9000000357627869, -1.899999976158142, 0.4000002145767212},
                         {0.8065550923347473, -1.93550443649292, 0.4743020236492157},
                         {0.7485938668251038, -1.9758095741271973, 0.5316148996353149}});
}

TEST_CASE("optimizer state round-trips and is keyed by parameter name") {
  OneParam a, b;
  AdamOptimizer oa("adamw", {&a.p}, 0.1, 0.9, 0.999, 1e-8, 0.01);
  a.set_grad(kGrads[0]);
  oa.step();
  AdamOptimizer ob("adamw", {&b.p}, 0.1, 0.9, 0.999, 1e-8, 0.01);
  StateDict s = oa.state();
  REQUIRE(compare_state(ob.state(), s).clean());
  ob.load_state(s);
  b.p.value.copy_from(a.p.value);
  a.set_grad(kGrads[1]);
  b.set_grad(kGrads[1]);
  oa.step();
  ob.step();
  CHECK(a.p.value.to_vector() == b.p.value.to_vector());
  AdamOptimizer wrong("adam", {&b.p}, 0.1, 0.9, 0.999, 1e-8, 0.01);
  CHECK_THROWS_WITH_AS(wrong.load_state(s), doctest::Contains("adamw"), std::runtime_error);
}

TEST_CASE("cosine schedule: closed form per epoch, like CosineAnnealingLR") {
  LrScheduler s("cosine", 1e-3, 15, 0.0);
  CHECK(s.lr() == 1e-3);
  for (int e = 0; e < 5; ++e) s.step();
  CHECK(s.lr() == doctest::Approx(0.75e-3).epsilon(1e-12));  // cos(pi/3) = 0.5
  for (int e = 5; e < 15; ++e) s.step();
  CHECK(std::fabs(s.lr()) < 1e-18);
  LrScheduler m("cosine", 0.1, 4, 0.01);
  m.step();
  m.step();
  CHECK(m.lr() == doctest::Approx(0.055).epsilon(1e-12));  // halfway: mean of base and eta_min
  // Restoring the counter gives the same value as stepping (no recursive drift).
  LrScheduler r("cosine", 1e-3, 15, 0.0);
  StateDict st = s.state();
  r.load_state(st);
  CHECK(r.lr() == s.lr());
  CHECK(r.last_epoch() == 15);
  LrScheduler c("constant", 0.5, 3, 0.0);
  c.step();
  CHECK(c.lr() == 0.5);
}

TEST_CASE("loss scaler: growth, backoff and skipped steps (GradScaler semantics)") {
  LossScaler s(true, 4.0, 2.0, 0.5, 3);
  s.set_active(true);
  CHECK(s.loss_scale() == 4.0f);
  // Hand-computed sequence: three finite steps grow the scale, an inf halves it.
  const bool infs[] = {false, false, false, true, false, false, true, false, false, false};
  const double scales[] = {4, 4, 8, 4, 4, 4, 2, 2, 2, 4};
  const int64_t trackers[] = {1, 2, 0, 0, 1, 2, 0, 1, 2, 0};
  for (int i = 0; i < 10; ++i) {
    s.update(infs[i]);
    CAPTURE(i);
    CHECK(s.scale() == scales[i]);
    CHECK(s.growth_tracker() == trackers[i]);
  }
}

TEST_CASE("loss scaler: a forced inf gradient skips the optimizer step and backs off") {
  Parameter p{"w", Tensor::from_vector({2}, {1.0f, 2.0f}), Tensor::from_vector({2}, {8.0f, 16.0f})};
  LossScaler s(true, 8.0, 2.0, 0.5, 2000);
  s.set_active(true);
  AdamOptimizer opt("adamw", {&p}, 0.1, 0.9, 0.999, 1e-8, 0.0);
  // Finite: gradients are unscaled by 1/8 and the step runs.
  bool found = s.unscale({&p});
  CHECK_FALSE(found);
  CHECK(p.grad.to_vector() == std::vector<float>{1.0f, 2.0f});
  s.update(found);
  opt.step();
  CHECK(s.scale() == 8.0);
  CHECK(opt.state().get_int("step/w") == 1);
  // Inf: the step is skipped (weights, moments and step count untouched), scale halves.
  const auto before = p.value.to_vector();
  p.grad = Tensor::from_vector({2}, {std::numeric_limits<float>::infinity(), 1.0f});
  found = s.unscale({&p});
  CHECK(found);
  s.update(found);
  if (!found) opt.step();
  CHECK(p.value.to_vector() == before);
  CHECK(s.scale() == 4.0);
  CHECK(s.growth_tracker() == 0);
  CHECK(opt.state().get_int("step/w") == 1);
  // NaN is caught too.
  p.grad = Tensor::from_vector({2}, {1.0f, std::nanf("")});
  CHECK(s.unscale({&p}));
}

TEST_CASE("disabled or inactive loss scaler leaves its state untouched") {
  LossScaler off(false, 65536, 2, 0.5, 2000);
  off.set_active(true);
  CHECK_FALSE(off.active());
  CHECK(off.loss_scale() == 1.0f);
  CHECK(off.scale() == 1.0);
  // fp16 run resumed on a CPU: enabled in the checkpoint, inactive here.
  LossScaler fp16(true, 65536, 2, 0.5, 2000);
  fp16.set_active(false);
  fp16.update(true);
  fp16.update(false);
  CHECK(fp16.scale() == 65536.0);
  CHECK(fp16.growth_tracker() == 0);
  CHECK(fp16.loss_scale() == 1.0f);
  StateDict st = fp16.state();
  CHECK(st.get_int("enabled") == 1);
  CHECK(st.get_real("scale") == 65536.0);
}
