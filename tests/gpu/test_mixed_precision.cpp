// The mixed-precision (fp16) convolution and linear ops against the fp32 reference
// backend, their overflow behaviour, and FashionCnn with set_precision(Fp16) against
// the same model in fp32.
//
// Tolerances. Rounding x, w or dy to fp16 changes each by at most u = 2^-11 ~ 4.9e-4
// relative, so each product term a*b is off by at most ~2u ~ 1e-3 of |a||b|. These
// errors have random signs, so over a K-term sum they grow like sqrt(K):
//   |got - want| <= 2e-3 * sqrt(K) * max|a| * max|b| + 1e-3 * |want| (+ 1e-3 * max|bias|)
// where the 1e-3 relative part covers the fp16 rounding of the convolution results
// (cuDNN writes fp16) and accumulation-order differences (fp32 accumulation), and the
// bias term the rounding of the convolution before the fp32 bias add. With uniform
// random operands the standard deviation of the rounding error is about
// 1.3e-4 * sqrt(K) * max|a| * max|b|, so the bound sits ~15 sigma out, while a wrong
// result (a bad layout, a missing term) is ~100x larger than the bound.
// Bias gradients stay fp32: 1e-4 of their magnitude, as in test_cuda_ops.cpp.
// Model level (4 stacked fp16 layers, fp32 BatchNorm between): logits within 1e-2 of
// the largest |logit| (a CPU emulation of the fp16 path gave <= 1e-3); parameter
// gradients in relative L2 norm, see the test (the MESSAGE lines log the margins).
//
// Exits with 77 (CTest: skipped) when the build has no CUDA backend or the machine
// has no GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"
#include "engine/nn/models/fashion_cnn.h"
#include "support/random_data.h"

#if defined(ENGINE_WITH_CUDA)
#include "kernels/cuda/settings.h"
#endif

namespace gpu = engine::kernels::cuda;
namespace ref = engine::kernels::ref;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;

namespace {

// Runs during static initialisation, before doctest's main: a test binary without a
// GPU has nothing to test, and exit code 77 tells CTest so.
struct SkipWithoutGpu {
  SkipWithoutGpu() {
    if (!(gpu::built() && engine::cuda_device_count() > 0)) {
      std::printf("no CUDA GPU: skipping\n");
      std::fflush(stdout);
      std::exit(77);
    }
  }
} skip_without_gpu;

}  // namespace

#if defined(ENGINE_WITH_CUDA)

namespace {

// ---- Device memory for tests ----------------------------------------------------------

class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t count)
      : count_(count), ptr_(static_cast<float*>(gpu::alloc(count * sizeof(float)))) {}
  explicit DeviceFloats(const std::vector<float>& host) : DeviceFloats(host.size()) {
    upload(host);
  }
  ~DeviceFloats() { gpu::free(ptr_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* get() { return ptr_; }
  void upload(const std::vector<float>& host) {
    REQUIRE(host.size() == count_);
    gpu::copy(ptr_, host.data(), count_ * sizeof(float), gpu::CopyKind::HostToDevice);
  }
  std::vector<float> download() const {
    std::vector<float> host(count_);
    gpu::copy(host.data(), ptr_, count_ * sizeof(float), gpu::CopyKind::DeviceToHost);
    return host;
  }
  // A byte pattern no op would produce, so "not written" shows up.
  void poison() {
    std::vector<float> junk(count_);
    std::memset(junk.data(), 0x7f, count_ * sizeof(float));
    upload(junk);
  }

 private:
  std::size_t count_;
  float* ptr_;
};

using test_support::uniform;

double magnitude(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// |got - want| <= abs + rel * |want| elementwise. Reports the count of mismatches, the
// first one, and the largest error relative to `abs` (so the margin shows in logs).
void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double err = std::fabs(g - w);
    const bool ok = err <= abs + rel * std::fabs(w);  // false for NaN
    if (abs > 0) worst = std::max(worst, std::isfinite(err) ? err / abs : 1e300);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " differ; first at " << first << ": got "
            << (bad ? got[first] : 0.0f) << ", want " << (bad ? want[first] : 0.0f)
            << " (abs tolerance " << abs << ", largest error / abs tolerance " << worst << ")");
  CHECK(bad == 0);
}

// The fp16 product bound from the header: K terms of a*b.
void check_f16(const std::vector<float>& got, const std::vector<float>& want, int64_t k,
               double max_a, double max_b, double max_bias, const std::string& what) {
  const double abs = 2e-3 * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1))) * max_a *
                         max_b + 1e-3 * max_bias + 1e-30;
  check_close(got, want, 1e-3, abs, what);
}

// fp32 results (bias gradients): 1e-4 of the output's magnitude.
void check_f32(const std::vector<float>& got, const std::vector<float>& want,
               const std::string& what) {
  check_close(got, want, 0.0, 1e-4 * std::max(1.0, magnitude(want)), what);
}

void check_bits(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) ++bad;
  INFO(what << ": " << bad << " of " << got.size() << " differ bitwise");
  CHECK(bad == 0);
}

// Every element inf or NaN (what the loss scaler looks for), at least one of them inf.
void check_all_nonfinite(const std::vector<float>& v, const std::string& what) {
  std::size_t finite = 0, inf = 0;
  for (float x : v) {
    if (std::isfinite(x)) ++finite;
    if (std::isinf(x)) ++inf;
  }
  INFO(what << ": " << finite << " of " << v.size() << " finite, " << inf << " inf");
  CHECK(finite == 0);
  CHECK(inf > 0);
}

void check_all_pos_inf(const std::vector<float>& v, const std::string& what) {
  std::size_t bad = 0;
  for (float x : v)
    if (!(std::isinf(x) && x > 0)) ++bad;
  INFO(what << ": " << bad << " of " << v.size() << " are not +inf");
  CHECK(bad == 0);
}

void check_all_finite(const std::vector<float>& v, const std::string& what) {
  std::size_t bad = 0;
  for (float x : v)
    if (!std::isfinite(x)) ++bad;
  INFO(what << ": " << bad << " of " << v.size() << " not finite");
  CHECK(bad == 0);
}

// ---- Convolution ------------------------------------------------------------------------

ConvShape conv_shape(int n, int c, int h, int w, int k, int r, int s, int pad) {
  ConvShape cs;
  cs.n = n, cs.c = c, cs.h = h, cs.w = w, cs.k = k, cs.r = r, cs.s = s, cs.pad = pad;
  return cs;
}

std::vector<ConvShape> conv_shapes() {
  return {
      conv_shape(8, 1, 28, 28, 32, 3, 3, 1),   // conv1 of the Fashion-MNIST CNN
      conv_shape(8, 32, 14, 14, 64, 3, 3, 1),  // conv2
      conv_shape(3, 5, 7, 9, 4, 5, 3, 1),      // non-square kernel and image, odd sizes
      conv_shape(2, 3, 6, 6, 2, 1, 1, 0),      // 1x1
      conv_shape(1, 2, 5, 5, 3, 5, 5, 2),      // kernel as large as the image
  };
}

std::size_t x_size(const ConvShape& s) { return static_cast<std::size_t>(s.n) * s.c * s.h * s.w; }
std::size_t w_size(const ConvShape& s) { return static_cast<std::size_t>(s.k) * s.c * s.r * s.s; }
std::size_t y_size(const ConvShape& s) {
  return static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
}

void run_conv_f16_checks(const char* mode) {
  uint32_t seed = 11;
  for (const ConvShape& s : conv_shapes()) {
    std::mt19937 rng(seed++);
    const std::string tag = std::string(mode) + " fp16 conv n=" + std::to_string(s.n) +
                            " c=" + std::to_string(s.c) + " h=" + std::to_string(s.h) +
                            " w=" + std::to_string(s.w) + " k=" + std::to_string(s.k) +
                            " r=" + std::to_string(s.r) + " s=" + std::to_string(s.s) +
                            " pad=" + std::to_string(s.pad);
    const auto xh = uniform(x_size(s), rng);
    const auto wh = uniform(w_size(s), rng, -0.5f, 0.5f);
    const auto bh = uniform(static_cast<std::size_t>(s.k), rng);
    const auto dyh = uniform(y_size(s), rng);
    std::vector<float> y_ref(dyh.size()), dx_ref(xh.size()), dw_ref(wh.size()), db_ref(bh.size());
    ref::conv2d_forward(s, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::conv2d_backward(s, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);
    const int64_t k_fwd = static_cast<int64_t>(s.c) * s.r * s.s;
    const int64_t k_dx = static_cast<int64_t>(s.k) * s.r * s.s;
    const int64_t k_dw = static_cast<int64_t>(s.n) * s.out_h() * s.out_w();

    DeviceFloats x(xh), w(wh), b(bh), dy(dyh), y(dyh.size()), dx(xh.size()), dw(wh.size()),
        db(bh.size());
    y.poison();
    dx.poison();
    dw.poison();
    db.poison();
    gpu::conv2d_forward_f16(s, x.get(), w.get(), b.get(), y.get());
    check_f16(y.download(), y_ref, k_fwd, mx, mw, mb, tag + " forward");

    gpu::conv2d_backward_f16(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
    const auto dx1 = dx.download(), dw1 = dw.download(), db1 = db.download();
    check_f16(dx1, dx_ref, k_dx, mw, mdy, 0.0, tag + " dx");
    check_f16(dw1, dw_ref, k_dw, mx, mdy, 0.0, tag + " dw");
    check_f32(db1, db_ref, tag + " db");

    // Again without dx (first layer) and into poisoned outputs: the same bits (the
    // deterministic setting holds for fp16 too in "deterministic" mode), dx untouched.
    dx.poison();
    dw.poison();
    db.poison();
    gpu::conv2d_backward_f16(s, x.get(), w.get(), dy.get(), nullptr, dw.get(), db.get());
    if (gpu::deterministic()) {
      check_bits(dw.download(), dw1, tag + " dw repeat (null dx)");
      check_bits(db.download(), db1, tag + " db repeat (null dx)");
    } else {
      check_f16(dw.download(), dw_ref, k_dw, mx, mdy, 0.0, tag + " dw (null dx)");
    }
    std::vector<float> junk(xh.size());
    std::memset(junk.data(), 0x7f, junk.size() * sizeof(float));
    check_bits(dx.download(), junk, tag + " dx untouched when null");

    // Without a bias: the convolution alone.
    std::vector<float> y_nobias_ref(dyh.size());
    ref::conv2d_forward(s, xh.data(), wh.data(), nullptr, y_nobias_ref.data());
    gpu::conv2d_forward_f16(s, x.get(), w.get(), nullptr, y.get());
    check_f16(y.download(), y_nobias_ref, k_fwd, mx, mw, 0.0, tag + " forward (no bias)");
  }
}

}  // namespace

TEST_CASE("fp16 conv2d forward and backward match the reference") {
  REQUIRE(gpu::deterministic());
  run_conv_f16_checks("deterministic");
}

TEST_CASE("fp16 conv2d with non-deterministic (timed) algorithm choice") {
  gpu::set_deterministic(false);
  run_conv_f16_checks("fastest");
  gpu::set_deterministic(true);
  CHECK(gpu::deterministic());
}

// ---- Linear -----------------------------------------------------------------------------

TEST_CASE("fp16 linear forward and backward match the reference") {
  const LinearShape shapes[] = {{5, 7, 3},     {64, 3136, 128}, {128, 128, 10},
                                {1, 1, 1},     {33, 65, 17},    {32, 3136, 128}};
  uint32_t seed = 100;
  for (const LinearShape& s : shapes) {
    std::mt19937 rng(seed++);
    const std::string tag = "fp16 linear n=" + std::to_string(s.n) +
                            " in=" + std::to_string(s.in) + " out=" + std::to_string(s.out);
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng);
    const auto wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, -0.1f, 0.1f);
    const auto bh = uniform(static_cast<std::size_t>(s.out), rng);
    const auto dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng);
    std::vector<float> y_ref(dyh.size()), dx_ref(xh.size()), dw_ref(wh.size()), db_ref(bh.size());
    ref::linear_forward(s, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::linear_backward(s, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);

    DeviceFloats x(xh), w(wh), b(bh), dy(dyh), y(dyh.size()), dx(xh.size()), dw(wh.size()),
        db(bh.size());
    y.poison();
    dx.poison();
    dw.poison();
    db.poison();
    gpu::linear_forward_f16(s, x.get(), w.get(), b.get(), y.get());
    gpu::linear_backward_f16(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
    check_f16(y.download(), y_ref, s.in, mx, mw, mb, tag + " forward");
    const auto dx1 = dx.download(), dw1 = dw.download();
    check_f16(dx1, dx_ref, s.out, mw, mdy, 0.0, tag + " dx");
    check_f16(dw1, dw_ref, s.n, mx, mdy, 0.0, tag + " dw");
    check_f32(db.download(), db_ref, tag + " db");

    // Repeat without dx: the same bits, dx untouched.
    dx.poison();
    dw.poison();
    gpu::linear_backward_f16(s, x.get(), w.get(), dy.get(), nullptr, dw.get(), nullptr);
    check_bits(dw.download(), dw1, tag + " dw repeat (null dx)");
    std::vector<float> junk(xh.size());
    std::memset(junk.data(), 0x7f, junk.size() * sizeof(float));
    check_bits(dx.download(), junk, tag + " dx untouched when null");
  }
}

TEST_CASE("fp16 linear with no input features gives the bias") {
  const LinearShape s{3, 0, 4};
  const std::vector<float> bh = {1.0f, -2.0f, 0.5f, 3.0f};
  DeviceFloats b(bh), y(12), db(4);
  y.poison();
  gpu::linear_forward_f16(s, nullptr, nullptr, b.get(), y.get());
  std::vector<float> want;
  for (int i = 0; i < s.n; ++i) want.insert(want.end(), bh.begin(), bh.end());
  check_bits(y.download(), want, "linear in=0 forward");
  DeviceFloats dy(std::vector<float>(12, 1.0f));
  gpu::linear_backward_f16(s, nullptr, nullptr, dy.get(), nullptr, nullptr, db.get());
  check_bits(db.download(), std::vector<float>(4, 3.0f), "linear in=0 db");
}

// ---- Overflow ---------------------------------------------------------------------------
// A loss scale that is too large must show up as inf/NaN in the weight and input
// gradients (the scaler then skips the step and backs off), never as clamped values.

TEST_CASE("fp16 conv2d: results beyond the fp16 range are +inf, not clamped") {
  // Positive operands, dy = 60000 (representable in fp16: 65504 is the largest), so
  // every dx and dw sum exceeds 65504 while every input is finite in fp16.
  const ConvShape s = conv_shape(2, 4, 8, 8, 8, 3, 3, 1);
  std::mt19937 rng(500);
  const auto xh = uniform(x_size(s), rng, 0.5f, 1.0f);
  const auto wh = uniform(w_size(s), rng, 0.5f, 1.0f);
  const std::vector<float> dyh(y_size(s), 60000.0f);
  DeviceFloats x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size()), db(static_cast<std::size_t>(s.k));
  gpu::conv2d_backward_f16(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
  check_all_pos_inf(dx.download(), "conv fp16 dx beyond 65504");
  check_all_pos_inf(dw.download(), "conv fp16 dw beyond 65504");
  check_all_finite(db.download(), "conv fp16 db (fp32 sum)");
  // The fp32 op on the same data: finite (the infs come from fp16, not the data).
  gpu::conv2d_backward(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
  check_all_finite(dx.download(), "conv fp32 dx");
  check_all_finite(dw.download(), "conv fp32 dw");
}

TEST_CASE("fp16 conv2d and linear: a scaled dy that overflows fp16 gives inf gradients") {
  const float scale = 65536.0f;  // a loss scale far too large for these values
  std::mt19937 rng(501);
  {
    const ConvShape s = conv_shape(2, 4, 8, 8, 8, 3, 3, 1);
    const auto xh = uniform(x_size(s), rng, 0.5f, 1.0f);
    const auto wh = uniform(w_size(s), rng, 0.5f, 1.0f);
    auto dyh = uniform(y_size(s), rng, 0.5f, 1.0f);
    for (float& v : dyh) v *= 6e4f * scale;
    DeviceFloats x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size());
    gpu::conv2d_backward_f16(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), nullptr);
    check_all_nonfinite(dx.download(), "conv fp16 dx from overflowing dy");
    check_all_nonfinite(dw.download(), "conv fp16 dw from overflowing dy");
  }
  {
    const LinearShape s{16, 96, 24};
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng, 0.5f, 1.0f);
    const auto wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, 0.5f, 1.0f);
    auto dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng, 0.5f, 1.0f);
    for (float& v : dyh) v *= 6e4f * scale;
    DeviceFloats x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size());
    gpu::linear_backward_f16(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), nullptr);
    check_all_nonfinite(dx.download(), "linear fp16 dx from overflowing dy");
    check_all_nonfinite(dw.download(), "linear fp16 dw from overflowing dy");
  }
}

TEST_CASE("fp16 linear: results are fp32, so sums beyond 65504 stay finite and accurate") {
  // By design (cuBLAS writes fp32): only the inputs are limited to the fp16 range.
  const LinearShape s{16, 96, 24};
  std::mt19937 rng(502);
  const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng, 0.5f, 1.0f);
  const auto wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, 0.5f, 1.0f);
  const std::vector<float> dyh(static_cast<std::size_t>(s.n) * s.out, 60000.0f);
  std::vector<float> dx_ref(xh.size()), dw_ref(wh.size());
  ref::linear_backward(s, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(), nullptr);
  CHECK(magnitude(dx_ref) > 65504.0);
  DeviceFloats x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size());
  gpu::linear_backward_f16(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), nullptr);
  // Same-sign terms: the error is at most ~2u of the sum itself.
  check_close(dx.download(), dx_ref, 2e-3, 0.0, "linear fp16 dx beyond 65504");
  check_close(dw.download(), dw_ref, 2e-3, 0.0, "linear fp16 dw beyond 65504");
}

// ---- Model level ------------------------------------------------------------------------

namespace {

struct ModelRun {
  std::vector<float> eval_logits, train_logits;
  std::map<std::string, std::vector<float>> grads;
};

// A fresh FashionCnn with seed-7 initialisation on `device` in `precision`: Eval
// logits, then a Train forward (dropout from an RNG of a fixed seed) and a backward
// of `dlogits`.
ModelRun run_model(engine::Device device, engine::Precision precision,
                   const std::vector<float>& images, const std::vector<float>& dlogits, int n) {
  engine::FashionCnn model(0.25f);
  engine::Rng init_rng(7);
  model.reset_parameters(init_rng);
  model.to(device);
  model.set_precision(precision);
  const engine::Tensor x = engine::Tensor::from_vector({n, 1, 28, 28}, images).to(device);
  const engine::Tensor dl =
      engine::Tensor::from_vector({n, engine::FashionCnn::kClasses}, dlogits).to(device);
  ModelRun out;
  engine::Rng rng(99);
  out.eval_logits = model.forward(x, engine::Mode::Eval, rng).to_vector();
  out.train_logits = model.forward(x, engine::Mode::Train, rng).to_vector();
  model.backward(dl);
  for (engine::Parameter* p : model.parameters()) out.grads[p->name] = p->grad.to_vector();
  return out;
}

// Largest |a - b| relative to max|b|, for the log.
double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d / std::max(magnitude(b), 1e-30);
}

}  // namespace

TEST_CASE("FashionCnn: fp16 on CUDA is close to fp32; fp16 on the CPU is fp32") {
  const int n = 32;
  std::mt19937 rng(600);
  // Normalised Fashion-MNIST pixels lie in about [-0.81, 2.02].
  const auto images = uniform(static_cast<std::size_t>(n) * 28 * 28, rng, -0.8f, 2.0f);
  // The batch-mean cross-entropy gradient is O(1/n); times a loss scale (as the trainer
  // does) it is O(1..1000). 64 keeps deep gradients clear of fp16 subnormals.
  auto dlogits = uniform(static_cast<std::size_t>(n) * engine::FashionCnn::kClasses, rng);
  for (float& v : dlogits) v *= 64.0f;

  const engine::Device cuda = engine::Device::cuda(0);
  const ModelRun f32 = run_model(cuda, engine::Precision::Fp32, images, dlogits, n);
  const ModelRun f16 = run_model(cuda, engine::Precision::Fp16, images, dlogits, n);

  const double eval_diff = relative_diff(f16.eval_logits, f32.eval_logits);
  const double train_diff = relative_diff(f16.train_logits, f32.train_logits);
  MESSAGE("fp16 vs fp32 logits: largest difference / max|logit|: eval " << eval_diff
          << ", train " << train_diff);
  CHECK(eval_diff <= 1e-2);
  CHECK(train_diff <= 1e-2);
  CHECK(eval_diff > 0.0);  // the fp16 path really ran
  check_all_finite(f16.eval_logits, "fp16 eval logits");

  // Gradients. ReLU masks and pooling argmaxes of near-ties flip between fp16 and fp32,
  // moving whole gradient terms, so the gradients agree in norm rather than element by
  // element: ||g16 - g32|| / ||g32|| <= 0.15 per tensor. (A CPU emulation of this path,
  // fp32 kernels on fp16-rounded operands, gave up to 0.05 over six seeds; a wrong
  // layout gives ~1.) The conv biases feed BatchNorm, so their exact gradient is zero
  // and both paths return rounding noise: they are held to 1e-3 of the layer's largest
  // weight gradient instead (emulation: ~1e-6).
  for (const auto& [name, g] : f32.grads) {
    const std::vector<float>& h = f16.grads.at(name);
    check_all_finite(h, name + " fp16 grad");
    const bool conv_bias = name.rfind("conv", 0) == 0 && name.find(".bias") != std::string::npos;
    if (conv_bias) {
      const std::string weight = name.substr(0, name.find('.')) + ".weight";
      double d = 0.0;
      for (std::size_t i = 0; i < g.size(); ++i)
        d = std::max(d, std::fabs(static_cast<double>(h[i]) - g[i]));
      const double rel = d / std::max(magnitude(f32.grads.at(weight)), 1e-30);
      MESSAGE(name << ": largest fp16-fp32 difference / max|" << weight << " grad| = " << rel);
      INFO(name);
      CHECK(rel <= 1e-3);
    } else {
      double num = 0.0, den = 0.0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        const double e = static_cast<double>(h[i]) - g[i];
        num += e * e;
        den += static_cast<double>(g[i]) * g[i];
      }
      const double rel = std::sqrt(num / std::max(den, 1e-300));
      MESSAGE(name << ": ||fp16 - fp32 grad|| / ||fp32 grad|| = " << rel);
      INFO(name);
      CHECK(rel <= 0.15);
    }
  }

  // On the CPU, Fp16 falls back to fp32: the same bits as Fp32.
  const engine::Device cpu = engine::Device::cpu();
  const ModelRun c32 = run_model(cpu, engine::Precision::Fp32, images, dlogits, n);
  const ModelRun c16 = run_model(cpu, engine::Precision::Fp16, images, dlogits, n);
  check_bits(c16.eval_logits, c32.eval_logits, "CPU fp16 eval logits");
  check_bits(c16.train_logits, c32.train_logits, "CPU fp16 train logits");
  for (const auto& [name, g] : c32.grads) check_bits(c16.grads.at(name), g, "CPU fp16 " + name);
}

#endif  // ENGINE_WITH_CUDA
