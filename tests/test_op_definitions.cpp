// The element-wise and reduction ops against their mathematical definitions, computed
// here independently in double or long double (never by calling kernels/elementwise.h,
// which both backends share): tests/ops/ (test_ops) checks that the fast CPU path agrees
// with the reference; this file checks that what they agree on is right. A mistake in
// the shared per-element maths (a wrong bias correction, a missing decay term, a
// softmax off by a factor) fails here even though cpu:: and ref:: still agree.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "support/random_data.h"

namespace {

// The per-step values the ops read from memory (StepValues): first sample 0, loss scale 1.
const int64_t kFirst0 = 0;
const float kScale1 = 1.0f;

namespace ref = engine::kernels::ref;
namespace cpu = engine::kernels::cpu;
using engine::kernels::AdamHyper;
using engine::kernels::AdamStepFactors;
using engine::kernels::WeightDecayMode;

using test_support::uniform;

// |got - want| within `rel` of |want| plus `abs`; counts the failures.
std::size_t count_far(const std::vector<float>& got, const std::vector<double>& want, double rel, double abs) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    bad += !(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs);
  return bad;
}

// PyTorch's AdamW / Adam (torch.optim docs, "Algorithm"), in double, step t = 1..:
//   AdamW: theta <- theta - lr*wd*theta          Adam: g <- g + wd*theta
//   m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2
//   m_hat = m / (1-b1^t);  v_hat = v / (1-b2^t)
//   theta <- theta - lr * m_hat / (sqrt(v_hat) + eps)
struct AdamDouble {
  double lr, b1, b2, eps, wd;
  WeightDecayMode mode;
  std::vector<double> p, m, v;
  void step(int t, const std::vector<float>& grad) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (mode == WeightDecayMode::Decoupled)
        p[i] -= lr * wd * p[i];
      else
        g += wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t));
      const double v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

}  // namespace

TEST_CASE("adam_update (ref and cpu) follows PyTorch's Adam and AdamW algorithm") {
  std::mt19937 g(2024);
  const std::size_t n = 4099;
  for (const WeightDecayMode mode : {WeightDecayMode::Decoupled, WeightDecayMode::L2})
    for (const float wd : {0.0f, 0.05f}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(wd);
      AdamHyper h;
      h.lr = 1e-2f;
      h.beta1 = 0.9f;
      h.beta2 = 0.999f;
      h.eps = 1e-8f;
      h.weight_decay = wd;
      h.decay = mode;
      const auto p0 = uniform(n, g, -1.0f, 1.0f);
      AdamDouble want{h.lr, h.beta1, h.beta2, h.eps, wd, mode,
                      std::vector<double>(p0.begin(), p0.end()), std::vector<double>(n, 0.0),
                      std::vector<double>(n, 0.0)};
      // Python floats: the hyper-parameters PyTorch sees are the doubles of these floats.
      want.lr = static_cast<double>(h.lr);
      want.b1 = static_cast<double>(h.beta1);
      want.b2 = static_cast<double>(h.beta2);
      want.wd = static_cast<double>(wd);
      auto p_ref = p0, p_cpu = p0;
      std::vector<float> m_ref(n, 0.0f), v_ref(n, 0.0f), m_cpu(n, 0.0f), v_cpu(n, 0.0f);
      for (int t = 1; t <= 6; ++t) {
        const auto grad = uniform(n, g, -0.1f, 0.1f);
        // The per-step factors as the optimizer computes them (engine/nn/optimizer.cpp).
        AdamStepFactors f{};
        f.step_size = static_cast<float>(want.lr / (1.0 - std::pow(want.b1, t)));
        f.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(want.b2, t)));
        f.decay_factor = static_cast<float>(1.0 - want.lr * want.wd);
        f.one_minus_beta1 = static_cast<float>(1.0 - want.b1);
        f.one_minus_beta2 = static_cast<float>(1.0 - want.b2);
        ref::adam_update(static_cast<int64_t>(n), p_ref.data(), grad.data(), m_ref.data(), v_ref.data(), h, &f, nullptr, 0, nullptr);
        cpu::adam_update(static_cast<int64_t>(n), p_cpu.data(), grad.data(), m_cpu.data(), v_cpu.data(), h, &f, nullptr, 0, nullptr);
        want.step(t, grad);
      }
      // Float against double over six steps: a few float roundings per step of each
      // quantity. A wrong bias correction or decay moves the parameters by ~lr (1e-2),
      // 1e4 times more than the tolerance. exp_avg is a signed running mean that can
      // cancel to near zero, so it gets an absolute floor of a few float ulps of |g|.
      CHECK(count_far(p_ref, want.p, 1e-5, 1e-6) == 0);
      CHECK(count_far(p_cpu, want.p, 1e-5, 1e-6) == 0);
      CHECK(count_far(m_cpu, want.m, 1e-5, 1e-7) == 0);
      CHECK(count_far(v_cpu, want.v, 1e-5, 1e-12) == 0);
      CHECK(count_far(m_ref, want.m, 1e-5, 1e-7) == 0);
      CHECK(count_far(v_ref, want.v, 1e-5, 1e-12) == 0);
    }
}

TEST_CASE("cross_entropy (ref and cpu): log-sum-exp loss, argmax, (softmax - onehot) * scale / n") {
  std::mt19937 g(77);
  for (const int classes : {1, 2, 10, 37})
    for (const int n : {1, 5, 64}) {
      CAPTURE(classes);
      CAPTURE(n);
      // Moderate logits: the definition is computed without the max shift, in long double.
      const auto z = uniform(static_cast<std::size_t>(n) * classes, g, -20.0f, 20.0f);
      std::uniform_int_distribution<int32_t> lab(0, classes - 1);
      std::vector<int32_t> labels(n);
      for (auto& l : labels) l = lab(g);
      for (const float scale : {1.0f, 1024.0f}) {
        std::vector<double> want_loss(n), want_d(z.size()), want_correct(n);
        for (int i = 0; i < n; ++i) {
          long double sum = 0.0L;
          int first_max = 0;
          for (int k = 0; k < classes; ++k) {
            sum += std::exp(static_cast<long double>(z[i * classes + k]));
            if (z[i * classes + k] > z[i * classes + first_max]) first_max = k;
          }
          want_loss[i] = static_cast<double>(std::log(sum) - z[i * classes + labels[i]]);
          want_correct[i] = first_max == labels[i] ? 1.0 : 0.0;
          for (int k = 0; k < classes; ++k) {
            const long double softmax = std::exp(static_cast<long double>(z[i * classes + k])) / sum;
            want_d[i * classes + k] =
                static_cast<double>((softmax - (k == labels[i] ? 1.0L : 0.0L)) * scale / n);
          }
        }
        for (const bool fast : {false, true}) {
          CAPTURE(fast);
          std::vector<float> loss(n), correct(n), d(z.size());
          (fast ? cpu::cross_entropy : ref::cross_entropy)(n, n, classes, z.data(), labels.data(), &scale,
                                                             &kFirst0, d.data(), loss.data(), correct.data());
          CHECK(count_far(loss, want_loss, 1e-6, 1e-6) == 0);
          CHECK(count_far(correct, want_correct, 0.0, 0.0) == 0);
          CHECK(count_far(d, want_d, 1e-6, 1e-9 * scale / n) == 0);
        }
      }
    }
  // Known answer: equal logits give loss log(C) and dlogits (1/C - onehot) / n.
  const std::vector<float> z(10, 0.5f);
  const int32_t label = 3;
  for (const bool fast : {false, true}) {
    float loss = 0, correct = -1;
    std::vector<float> d(10);
    (fast ? cpu::cross_entropy : ref::cross_entropy)(1, 1, 10, z.data(), &label, &kScale1, &kFirst0, d.data(), &loss, &correct);
    CHECK(loss == doctest::Approx(std::log(10.0)).epsilon(1e-7));
    CHECK(correct == 0.0f);  // ties: the first maximum (class 0) is the prediction
    CHECK(d[0] == doctest::Approx(0.1).epsilon(1e-7));
    CHECK(d[3] == doctest::Approx(-0.9).epsilon(1e-7));
  }
}

TEST_CASE("reduce_sum (ref and cpu) against a long double sum") {
  std::mt19937 g(99);
  for (const int64_t n : {0, 1, 7, 8, 9, 1000, 55000, 1 << 20}) {
    CAPTURE(n);
    const auto x = uniform(static_cast<std::size_t>(n), g, 0.0f, 3.0f);  // loss-like: one sign
    long double want = 0.0L;
    for (float v : x) want += v;
    for (const bool fast : {false, true}) {
      CAPTURE(fast);
      const double got = (fast ? cpu::reduce_sum : ref::reduce_sum)(n, x.data());
      // Double accumulation of at most 2^20 one-signed terms: relative error <= n * 2^-53.
      CHECK(std::fabs(got - static_cast<double>(want)) <= 1e-16 * static_cast<double>(n) * static_cast<double>(want) + 1e-300);
    }
  }
}

TEST_CASE("relu backward (ref and cpu): dy where the output is positive, else 0") {
  std::mt19937 g(5);
  const std::size_t n = 10007;
  const auto y_in = uniform(n, g, -1.0f, 1.0f);
  std::vector<float> y(n);
  for (std::size_t i = 0; i < n; ++i) y[i] = y_in[i] > 0 ? y_in[i] : 0.0f;  // a ReLU output
  const auto dy = uniform(n, g, -3.0f, 3.0f);
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = y[i] > 0 ? dy[i] : 0.0;
  for (const bool fast : {false, true}) {
    std::vector<float> dx(n, std::numeric_limits<float>::quiet_NaN());
    (fast ? cpu::relu_backward : ref::relu_backward)(static_cast<int64_t>(n), y.data(), dy.data(), dx.data());
    CHECK(count_far(dx, want, 0.0, 0.0) == 0);
  }
}

TEST_CASE("gather_batch (ref and cpu): (byte / 255 - mean) / std of the indexed image, and its label") {
  const int pixels = 784, images_n = 256;
  std::vector<uint8_t> images(static_cast<std::size_t>(images_n) * pixels), labels(images_n);
  for (std::size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>((i * 131 + i / 784) % 256);
  for (int i = 0; i < images_n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  const std::vector<int32_t> idx = {255, 0, 17, 17, 128};
  const int n = static_cast<int>(idx.size());
  const double mean = 0.2860, sd = 0.3530;
  std::vector<double> want(static_cast<std::size_t>(n) * pixels);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < pixels; ++p)
      want[static_cast<std::size_t>(i) * pixels + p] =
          (images[static_cast<std::size_t>(idx[i]) * pixels + p] / 255.0 - static_cast<float>(mean)) /
          static_cast<float>(sd);
  for (const bool fast : {false, true}) {
    CAPTURE(fast);
    std::vector<float> out(want.size());
    std::vector<int32_t> lab(n, -1);
    (fast ? cpu::gather_batch : ref::gather_batch)(n, pixels, images.data(), labels.data(), idx.data(),
                                                   &kFirst0, static_cast<float>(mean), static_cast<float>(sd),
                                                   out.data(), lab.data());
    // Three float roundings of values below 3 in magnitude.
    CHECK(count_far(out, want, 4e-7, 4e-7) == 0);
    for (int i = 0; i < n; ++i) CHECK(lab[i] == labels[idx[i]]);
  }
}
