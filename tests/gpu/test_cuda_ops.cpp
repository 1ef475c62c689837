// The CUDA backend against the reference backend, op by op: random inputs with fixed
// seeds, engine::kernels::ref on the host, engine::kernels::cuda on device copies.
// Tolerances:
//  * bit for bit where the GPU evaluates the reference's per-element formula with the
//    same types (kernels/elementwise.h; -fmad=false): ReLU, max pooling (values,
//    argmax, gradient), dropout (mask, y, dx), batch gathering, fp16 casts, batch-norm
//    evaluation, Adam, loss unscaling, Philox;
//  * our own reductions (batch-norm statistics and gradients, the bias gradients,
//    reduce_sum): bounds derived from the summation order, about one ulp
//    (tests/gpu/reduction_bounds.h, whose derivation and host emulation of the GPU's
//    order tests/test_reduction_bounds.cpp checks on the CPU), on ragged shapes too;
//  * cuDNN convolutions and cuBLAS GEMMs: 1e-4 of the output's magnitude. Their
//    algorithm (and with Winograd or FFT, their error) is the library's choice, so no
//    order-based bound applies; cross-entropy: rel 1e-5 (exp and log on the device).
// Backward ops are also run twice to check that their bits never change (determinism).
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
#include <random>
#include <string>
#include <vector>

#include "engine/kernels/philox.h"
#include "gpu/reduction_bounds.h"
#include "gpu/device_test_util.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"
#include "support/random_data.h"

#if defined(ENGINE_WITH_CUDA)
#include "gpu/philox_check.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/settings.h"
#endif

namespace gpu = engine::kernels::cuda;
namespace ref = engine::kernels::ref;
namespace rb = reduction_bounds;
using engine::PhiloxStream;
using engine::kernels::AdamHyper;
using engine::kernels::AdamStepFactors;
using engine::kernels::BatchNormShape;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;
using engine::kernels::PoolShape;
using engine::kernels::WeightDecayMode;

using gpu_test::DeviceArray;

namespace {

// ---- Random inputs --------------------------------------------------------------------

using test_support::uniform;

// Values from a small set, so that maxima tie often.
std::vector<float> quantised(std::size_t n, std::mt19937& rng, int levels) {
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng)) * 0.5f - 1.0f;
  return v;
}

// ---- Comparisons ----------------------------------------------------------------------

double magnitude(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// |got - want| <= abs + rel * |want| elementwise (NaN matches NaN). Reports the count
// of mismatches and the first one.
void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = (std::isnan(g) && std::isnan(w)) || std::fabs(g - w) <= abs + rel * std::fabs(w);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " differ; first at " << first << ": got "
            << (bad ? got[first] : 0.0f) << ", want " << (bad ? want[first] : 0.0f));
  CHECK(bad == 0);
}

// Convolutions and GEMMs: error within 1e-4 of the output's largest magnitude.
void check_gemm_like(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  check_close(got, want, 0.0, 1e-4 * std::max(1.0, magnitude(want)), what);
}

// |got - want| <= bound elementwise, the bounds of tests/gpu/reduction_bounds.h.
void check_bound(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& bound, const std::string& what) {
  const rb::Comparison c = rb::compare(got, want, bound);
  INFO(what << ": " << c.describe(got, want, bound));
  CHECK(c.bad == 0);
}

template <typename T>
void check_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  INFO(what << ": " << bad << " of " << got.size() << " differ bitwise; first at " << first);
  CHECK(bad == 0);
}

}  // namespace

// ---- Runtime ----------------------------------------------------------------------------

TEST_CASE("runtime: device name, copies, memset") {
  CHECK(gpu::built());
  CHECK(!gpu::device_name(0).empty());
  CHECK(gpu::device_name(gpu::device_count()).empty());  // out of range: ""
  gpu::set_device(0);

  std::mt19937 rng(1);
  const std::vector<float> host = uniform(1000, rng);
  DeviceArray<float> a(host), b(host.size());
  gpu::copy(b.get(), a.get(), host.size() * sizeof(float), gpu::CopyKind::DeviceToDevice);
  check_bits(b.download(), host, "device-to-device round trip");
  gpu::memset_zero(b.get(), host.size() * sizeof(float));
  check_bits(b.download(), std::vector<float>(host.size(), 0.0f), "memset_zero");
  gpu::synchronize();
  CHECK(gpu::alloc(0) == nullptr);
  gpu::free(nullptr);
}

// ---- Philox -----------------------------------------------------------------------------

#if defined(ENGINE_WITH_CUDA)
TEST_CASE("philox: device philox_at equals the host and cuRAND's curand()") {
  const std::vector<uint64_t> seeds = {0,           1,          42,          0x123456789abcdefull,
                                       ~0ull,       7,          7,           7,
                                       99,          2024,       0xdeadbeefull, 5};
  const std::vector<uint64_t> subsequences = {0, 0, 3, 17, 1ull << 40, 0, 1, 0xffffffffull,
                                              (1ull << 32) + 5, 123456789, 2, ~0ull};
  // Offsets cover each word of a block, block counters past 2^32, and large values.
  const std::vector<uint64_t> offsets = {0, 1, 2, 3, 4, 5, 1000003, (1ull << 34) + 3,
                                         (1ull << 40) + 6, 123456789012ull, 7, 11};
  const int count = static_cast<int>(seeds.size());
  std::vector<uint32_t> host(seeds.size()), device(seeds.size()), curand(seeds.size());
  for (int i = 0; i < count; ++i)
    host[i] = engine::philox_at(PhiloxStream{seeds[i], subsequences[i]}, offsets[i]);
  gpu_test::philox_device_values(count, seeds.data(), subsequences.data(), offsets.data(),
                                 device.data());
  gpu_test::curand_reference_values(count, seeds.data(), subsequences.data(),
                                    offsets.data(), curand.data());
  check_bits(device, host, "device philox_at vs host philox_at");
  check_bits(curand, host, "cuRAND curand() vs host philox_at");
}

TEST_CASE("casts: fp32 <-> fp16") {
  const std::vector<float> values = {0.0f,    -0.0f, 1.0f,     -2.5f,   65504.0f, 65520.0f,
                                     1e-8f,   0.1f,  1.0f / 3, 6e-5f,   -1e5f,
                                     std::numeric_limits<float>::infinity()};
  // Expected fp16 values, as floats: round to nearest even, overflow to inf.
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> expected = {0.0f,          -0.0f,        1.0f, -2.5f, 65504.0f, inf,
                                       0.0f,          0.0999755859375f, 0.333251953125f,
                                       6.002187728881836e-05f, -inf, inf};
  const int64_t n = static_cast<int64_t>(values.size());
  DeviceArray<float> in(values), back(values.size());
  DeviceArray<uint16_t> half(values.size());
  gpu::cast_f32_to_f16(n, in.get(), half.get());
  gpu::cast_f16_to_f32(n, half.get(), back.get());
  check_bits(back.download(), expected, "fp32 -> fp16 -> fp32");
  const std::vector<uint16_t> bits = half.download();
  CHECK(bits[2] == 0x3c00);  // 1.0
  CHECK(bits[5] == 0x7c00);  // 65520 rounds up to +inf
}
#endif

// ---- Convolution ------------------------------------------------------------------------

namespace {

struct ConvCase {
  ConvShape s;
  std::vector<float> x, w, b, dy;
};

ConvCase make_conv(ConvShape s, uint32_t seed) {
  std::mt19937 rng(seed);
  ConvCase c;
  c.s = s;
  c.x = uniform(static_cast<std::size_t>(s.n) * s.c * s.h * s.w, rng);
  c.w = uniform(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, rng, -0.5f, 0.5f);
  c.b = uniform(static_cast<std::size_t>(s.k), rng);
  c.dy = uniform(static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w(), rng);
  return c;
}

std::vector<ConvShape> conv_shapes() {
  std::vector<ConvShape> shapes;
  auto add = [&](int n, int c, int h, int w, int k, int r, int s, int pad) {
    ConvShape cs;
    cs.n = n, cs.c = c, cs.h = h, cs.w = w, cs.k = k, cs.r = r, cs.s = s, cs.pad = pad;
    shapes.push_back(cs);
  };
  add(2, 1, 28, 28, 8, 3, 3, 1);    // first layer of the Fashion-MNIST CNN
  add(4, 16, 14, 14, 32, 3, 3, 1);  // a later layer
  add(3, 5, 7, 9, 4, 5, 3, 1);      // non-square kernel and image
  add(2, 3, 6, 6, 2, 1, 1, 0);      // 1x1
  add(1, 2, 5, 5, 3, 5, 5, 2);      // kernel as large as the image
  return shapes;
}

void run_conv_checks(const char* mode) {
  for (const ConvShape& s : conv_shapes()) {
    const ConvCase c = make_conv(s, 7u + static_cast<uint32_t>(s.c * 31 + s.k));
    const std::string tag = std::string(mode) + " conv c=" + std::to_string(s.c) +
                            " k=" + std::to_string(s.k) + " r=" + std::to_string(s.r) +
                            " s=" + std::to_string(s.s) + " pad=" + std::to_string(s.pad);
    std::vector<float> y_ref(c.dy.size()), dx_ref(c.x.size()), dw_ref(c.w.size()),
        db_ref(c.b.size());
    ref::conv2d_forward(s, c.x.data(), c.w.data(), c.b.data(), y_ref.data());
    ref::conv2d_backward(s, c.x.data(), c.w.data(), c.dy.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());

    DeviceArray<float> x(c.x), w(c.w), b(c.b), dy(c.dy), y(c.dy.size()), dx(c.x.size()),
        dw(c.w.size()), db(c.b.size());
    y.poison();
    dx.poison();
    dw.poison();
    db.poison();
    gpu::conv2d_forward(s, x.get(), w.get(), b.get(), y.get());
    check_gemm_like(y.download(), y_ref, tag + " forward");

    gpu::conv2d_backward(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
    check_gemm_like(dx.download(), dx_ref, tag + " dx");
    check_gemm_like(dw.download(), dw_ref, tag + " dw");
    check_gemm_like(db.download(), db_ref, tag + " db");

    // Without dx (first layer): dw and db still right, dx untouched.
    dw.poison();
    db.poison();
    dx.poison();
    gpu::conv2d_backward(s, x.get(), w.get(), dy.get(), nullptr, dw.get(), db.get());
    check_gemm_like(dw.download(), dw_ref, tag + " dw (null dx)");
    check_gemm_like(db.download(), db_ref, tag + " db (null dx)");
    std::vector<float> junk(c.x.size());
    std::memset(junk.data(), 0x7f, junk.size() * sizeof(float));
    check_bits(dx.download(), junk, tag + " dx untouched when null");
  }
}

}  // namespace

TEST_CASE("conv2d forward and backward match the reference") { run_conv_checks("deterministic"); }

#if defined(ENGINE_WITH_CUDA)
TEST_CASE("conv2d with non-deterministic (timed) algorithm choice") {
  gpu::set_deterministic(false);
  run_conv_checks("fastest");
  gpu::set_deterministic(true);
  CHECK(gpu::deterministic());
}
#endif

// ---- Linear -----------------------------------------------------------------------------

TEST_CASE("linear forward and backward match the reference") {
  const LinearShape shapes[] = {{5, 7, 3}, {64, 3136, 128}, {128, 128, 10}, {1, 1, 1}, {33, 65, 17}};
  uint32_t seed = 100;
  for (const LinearShape& s : shapes) {
    std::mt19937 rng(seed++);
    const std::string tag = "linear n=" + std::to_string(s.n) + " in=" + std::to_string(s.in) +
                            " out=" + std::to_string(s.out);
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng);
    const auto wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, -0.1f, 0.1f);
    const auto bh = uniform(static_cast<std::size_t>(s.out), rng);
    const auto dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng);
    std::vector<float> y_ref(dyh.size()), dx_ref(xh.size()), dw_ref(wh.size()), db_ref(bh.size());
    ref::linear_forward(s, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::linear_backward(s, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());

    DeviceArray<float> x(xh), w(wh), b(bh), dy(dyh), y(dyh.size()), dx(xh.size()), dw(wh.size()),
        db(bh.size());
    y.poison();
    dx.poison();
    dw.poison();
    db.poison();
    gpu::linear_forward(s, x.get(), w.get(), b.get(), y.get());
    gpu::linear_backward(s, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
    check_gemm_like(y.download(), y_ref, tag + " forward");
    check_gemm_like(dx.download(), dx_ref, tag + " dx");
    check_gemm_like(dw.download(), dw_ref, tag + " dw");
    check_gemm_like(db.download(), db_ref, tag + " db");
  }
}

// ---- Batch normalisation ----------------------------------------------------------------

namespace {

// Train forward, eval forward and backward of one shape against the reference: the
// statistics, outputs and gradients within the bounds derived from the summation order
// (reduction_bounds.h), evaluation bit for bit; then backward in place (dx == dy) bit
// for bit against out of place.
void check_batchnorm(const BatchNormShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::string tag = "batchnorm n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) +
                          " hw=" + std::to_string(s.hw) + " (" +
                          std::to_string(gpu::channel_slices(static_cast<int64_t>(s.n) * s.hw)) +
                          " slices)";
  const std::size_t total = static_cast<std::size_t>(s.n) * s.c * s.hw;
  const std::size_t c = static_cast<std::size_t>(s.c);
  const auto xh = uniform(total, rng, -2.0f, 3.0f);
  const auto dyh = uniform(total, rng);
  const auto gh = uniform(c, rng, 0.5f, 1.5f);
  const auto bh = uniform(c, rng);
  const auto rm0 = uniform(c, rng);
  const auto rv0 = uniform(c, rng, 0.5f, 2.0f);
  const float eps = 1e-5f, momentum = 0.1f;

  std::vector<float> rm_ref = rm0, rv_ref = rv0, sm_ref(c), si_ref(c), y_ref(total),
                     ye_ref(total), dx_ref(total), dg_ref(c), db_ref(c);
  ref::batchnorm_forward_train(s, xh.data(), gh.data(), bh.data(), eps, momentum, rm_ref.data(),
                               rv_ref.data(), sm_ref.data(), si_ref.data(), y_ref.data());
  ref::batchnorm_forward_eval(s, xh.data(), gh.data(), bh.data(), rm0.data(), rv0.data(), eps,
                              ye_ref.data());
  ref::batchnorm_backward(s, xh.data(), dyh.data(), gh.data(), sm_ref.data(), si_ref.data(),
                          dx_ref.data(), dg_ref.data(), db_ref.data());
  const rb::ForwardTolerances ft = rb::forward_tolerances(
      s, xh.data(), gh.data(), bh.data(), eps, momentum, y_ref, rm_ref, rv_ref, sm_ref, si_ref);
  const rb::BackwardTolerances bt = rb::backward_tolerances(
      s, xh.data(), dyh.data(), gh.data(), sm_ref.data(), si_ref.data(), dx_ref, dg_ref, db_ref);

  DeviceArray<float> x(xh), dy(dyh), g(gh), b(bh), rm(rm0), rv(rv0), sm(c), si(c), y(total),
      ye(total), dx(total), dg(c), db(c);
  y.poison();
  gpu::batchnorm_forward_train(s, x.get(), g.get(), b.get(), eps, momentum, rm.get(), rv.get(),
                               sm.get(), si.get(), y.get());
  check_bound(y.download(), y_ref, ft.y, tag + " train y");
  check_bound(sm.download(), sm_ref, ft.save_mean, tag + " save_mean");
  check_bound(si.download(), si_ref, ft.save_invstd, tag + " save_invstd");
  check_bound(rm.download(), rm_ref, ft.running_mean, tag + " running_mean");
  check_bound(rv.download(), rv_ref, ft.running_var, tag + " running_var");

  DeviceArray<float> rm_eval(rm0), rv_eval(rv0);
  ye.poison();
  gpu::batchnorm_forward_eval(s, x.get(), g.get(), b.get(), rm_eval.get(), rv_eval.get(), eps,
                              ye.get());
  check_bits(ye.download(), ye_ref, tag + " eval y");  // per element, same formula

  // Backward from the reference's saved statistics, so only the op itself is compared.
  DeviceArray<float> sm_in(sm_ref), si_in(si_ref);
  dx.poison();
  gpu::batchnorm_backward(s, x.get(), dy.get(), g.get(), sm_in.get(), si_in.get(), dx.get(),
                          dg.get(), db.get());
  const std::vector<float> dx_gpu = dx.download(), dg_gpu = dg.download(), db_gpu = db.download();
  check_bound(dx_gpu, dx_ref, bt.dx, tag + " dx");
  check_bound(dg_gpu, dg_ref, bt.dgamma, tag + " dgamma");
  check_bound(db_gpu, db_ref, bt.dbeta, tag + " dbeta");

  // In place over many slices: every block reads its slice of dy before writing dx
  // there, and the sums come from pass 1, so in place must equal out of place.
  DeviceArray<float> inplace(dyh), dg2(c), db2(c);
  gpu::batchnorm_backward(s, x.get(), inplace.get(), g.get(), sm_in.get(), si_in.get(),
                          inplace.get(), dg2.get(), db2.get());
  check_bits(inplace.download(), dx_gpu, tag + " dx in place");
  check_bits(dg2.download(), dg_gpu, tag + " dgamma (in-place call)");
  check_bits(db2.download(), db_gpu, tag + " dbeta (in-place call)");
}

}  // namespace

TEST_CASE("batchnorm train, eval and backward match the reference") {
  // The GPU spreads each channel's n*hw elements over up to 32 slices of >= 1024
  // (kernels/cuda/reduction_order.h): 1, 4, 1, 7 and 32 slices here, all even.
  const BatchNormShape shapes[] = {{4, 3, 25}, {16, 32, 196}, {2, 5, 1}, {128, 8, 49},
                                   {128, 4, 784}};
  uint32_t seed = 200;
  for (const BatchNormShape& s : shapes) check_batchnorm(s, seed++);
}

TEST_CASE("batchnorm on ragged slices (the real shapes) within the derived bounds") {
  // {128,64,196}: 25 slices, the last 992 elements; {88,64,196}: 17, the last 1008;
  // {88,32,784}: 32 (capped); {3,5,1025}: 4, the last 768; {1,7,5000}: 5, n = 1.
  uint32_t seed = 250;
  for (const BatchNormShape& s : rb::ragged_shapes()) check_batchnorm(s, seed++);
}

TEST_CASE("bias gradients (channel_sum) on ragged slices within the derived bound") {
  std::mt19937 rng(270);
  // conv2d_backward with only db: dy [n, k, 14, 14] (m = n * 196: 25 or 17 slices).
  for (int n : {128, 88}) {
    ConvShape s;
    s.n = n, s.c = 32, s.h = 14, s.w = 14, s.k = 64, s.r = 3, s.s = 3, s.pad = 1;
    const int64_t hw = static_cast<int64_t>(s.out_h()) * s.out_w();
    const auto dyh = uniform(static_cast<std::size_t>(n) * s.k * hw, rng);
    const std::vector<float> x0(static_cast<std::size_t>(n) * s.c * s.h * s.w, 0.0f);
    const std::vector<float> w0(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, 0.0f);
    std::vector<float> dx_ref(x0.size()), dw_ref(w0.size()), db_ref(static_cast<std::size_t>(s.k));
    ref::conv2d_backward(s, x0.data(), w0.data(), dyh.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    DeviceArray<float> x(x0), w(w0), dy(dyh), db(static_cast<std::size_t>(s.k));
    db.poison();
    gpu::conv2d_backward(s, x.get(), w.get(), dy.get(), nullptr, nullptr, db.get());
    check_bound(db.download(), db_ref, rb::channel_sum_tolerances(n, s.k, hw, dyh.data(), db_ref),
                "conv db n=" + std::to_string(n));
  }
}

// ---- ReLU, pooling, dropout -------------------------------------------------------------

TEST_CASE("relu forward and backward match the reference") {
  std::mt19937 rng(300);
  const int64_t n = 100003;
  auto xh = quantised(static_cast<std::size_t>(n), rng, 7);  // includes exact zeros
  const auto dyh = uniform(static_cast<std::size_t>(n), rng);
  std::vector<float> y_ref(xh.size()), dx_ref(xh.size());
  ref::relu_forward(n, xh.data(), y_ref.data());
  ref::relu_backward(n, y_ref.data(), dyh.data(), dx_ref.data());
  DeviceArray<float> x(xh), dy(dyh), y(xh.size()), dx(xh.size());
  gpu::relu_forward(n, x.get(), y.get());
  gpu::relu_backward(n, y.get(), dy.get(), dx.get());
  check_bits(y.download(), y_ref, "relu forward");
  check_bits(dx.download(), dx_ref, "relu backward");
}

TEST_CASE("maxpool2x2 forward and backward match the reference (ties: first wins)") {
  const PoolShape shapes[] = {{2, 3, 28, 28}, {4, 16, 14, 14}, {1, 1, 2, 2}, {3, 2, 6, 10}};
  uint32_t seed = 400;
  for (const PoolShape& s : shapes) {
    std::mt19937 rng(seed++);
    const std::string tag = "maxpool c=" + std::to_string(s.c) + " h=" + std::to_string(s.h) +
                            " w=" + std::to_string(s.w);
    const std::size_t in_n = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    const std::size_t out_n = in_n / 4;
    auto xh = quantised(in_n, rng, 3);  // many ties
    if (in_n > 40) xh[37] = std::numeric_limits<float>::quiet_NaN();  // NaN propagates
    const auto dyh = uniform(out_n, rng);
    std::vector<float> y_ref(out_n), dx_ref(in_n);
    std::vector<int32_t> am_ref(out_n);
    ref::maxpool2x2_forward(s, xh.data(), y_ref.data(), am_ref.data());
    ref::maxpool2x2_backward(s, dyh.data(), am_ref.data(), dx_ref.data());

    DeviceArray<float> x(xh), y(out_n), dy(dyh), dx(in_n);
    DeviceArray<int32_t> am(out_n);
    dx.poison();
    gpu::maxpool2x2_forward(s, x.get(), y.get(), am.get());
    gpu::maxpool2x2_backward(s, dy.get(), am.get(), dx.get());
    check_bits(am.download(), am_ref, tag + " argmax");
    check_bits(y.download(), y_ref, tag + " y");
    check_bits(dx.download(), dx_ref, tag + " dx");
  }
}

TEST_CASE("dropout masks match the reference bit for bit") {
  const float ps[] = {0.0f, 0.25f, 0.5f, 0.9f, 1.0f};
  const uint64_t offsets[] = {0, 12345, (1ull << 33) + 3};
  std::mt19937 rng(500);
  const int64_t n = 10007;
  const auto xh = uniform(static_cast<std::size_t>(n), rng);
  const auto dyh = uniform(static_cast<std::size_t>(n), rng);
  DeviceArray<float> x(xh), dy(dyh), y(xh.size()), dx(xh.size());
  DeviceArray<uint8_t> keep(xh.size());
  for (float p : ps)
    for (uint64_t offset : offsets) {
      const PhiloxStream stream{0x5eedull + offset, 3};
      const std::string tag = "dropout p=" + std::to_string(p) + " offset=" + std::to_string(offset);
      std::vector<float> y_ref(xh.size()), dx_ref(xh.size());
      std::vector<uint8_t> keep_ref(xh.size());
      ref::dropout_forward(n, xh.data(), p, stream, offset, y_ref.data(), keep_ref.data());
      ref::dropout_backward(n, dyh.data(), keep_ref.data(), p, dx_ref.data());
      gpu::dropout_forward(n, x.get(), p, stream, offset, y.get(), keep.get());
      gpu::dropout_backward(n, dy.get(), keep.get(), p, dx.get());
      check_bits(keep.download(), keep_ref, tag + " keep");
      check_bits(y.download(), y_ref, tag + " y");  // one float multiply on both sides
      check_bits(dx.download(), dx_ref, tag + " dx");
    }
}

// ---- Loss, sum, batches -----------------------------------------------------------------

TEST_CASE("cross_entropy matches the reference") {
  struct Case {
    int n, classes;
    float grad_scale;
  };
  const Case cases[] = {{37, 10, 1.0f}, {128, 10, 1024.0f}, {5, 100, 1.0f}, {3, 1, 2.0f}};
  uint32_t seed = 600;
  for (const Case& cs : cases) {
    std::mt19937 rng(seed++);
    const std::string tag = "cross_entropy n=" + std::to_string(cs.n) +
                            " classes=" + std::to_string(cs.classes);
    const std::size_t total = static_cast<std::size_t>(cs.n) * cs.classes;
    auto logits = uniform(total, rng, -5.0f, 5.0f);
    // Some rows with tied maxima, to check that the first maximum counts as the prediction.
    for (int i = 0; i < cs.n; i += 4)
      for (int k = 0; k < cs.classes; ++k)
        logits[static_cast<std::size_t>(i) * cs.classes + k] = (k % 3 == 1) ? 2.0f : -1.0f;
    std::uniform_int_distribution<int> label_d(0, cs.classes - 1);
    std::vector<int32_t> labels(static_cast<std::size_t>(cs.n));
    for (int32_t& l : labels) l = label_d(rng);
    if (cs.classes > 1) labels[0] = 1;  // row 0 is tied: class 1 is its first maximum

    std::vector<float> dl_ref(total), loss_ref(labels.size()), corr_ref(labels.size());
    ref::cross_entropy(cs.n, cs.n, cs.classes, logits.data(), labels.data(), cs.grad_scale,
                       dl_ref.data(), loss_ref.data(), corr_ref.data());

    DeviceArray<float> z(logits), dl(total), loss(labels.size()), corr(labels.size());
    DeviceArray<int32_t> lab(labels);
    gpu::cross_entropy(cs.n, cs.n, cs.classes, z.get(), lab.get(), cs.grad_scale, dl.get(), loss.get(),
                       corr.get());
    check_close(loss.download(), loss_ref, 1e-5, 1e-6, tag + " loss");
    check_bits(corr.download(), corr_ref, tag + " correct");
    check_close(dl.download(), dl_ref, 1e-5, 1e-6 * magnitude(dl_ref), tag + " dlogits");

    // Without dlogits (evaluation): same loss and correctness.
    loss.poison();
    gpu::cross_entropy(cs.n, cs.n, cs.classes, z.get(), lab.get(), cs.grad_scale, nullptr, loss.get(),
                       corr.get());
    check_close(loss.download(), loss_ref, 1e-5, 1e-6, tag + " loss (no dlogits)");
  }
}

// The GPU's double exp against libm's: each probability within one float ulp.
TEST_CASE("softmax matches the reference within one float ulp") {
  std::mt19937 rng(640);
  const float inf = std::numeric_limits<float>::infinity();
  for (const int classes : {1, 10, 33}) {
    const int n = 4099;
    CAPTURE(classes);
    auto logits = uniform(static_cast<std::size_t>(n) * classes, rng, -30.0f, 30.0f);
    logits[0] = 1e30f;
    if (classes > 1) logits[static_cast<std::size_t>(classes) + 1] = -inf;
    std::vector<float> want(logits.size());
    ref::softmax(n, classes, logits.data(), want.data());
    DeviceArray<float> z(logits), p(logits.size());
    gpu::softmax(n, classes, z.get(), p.get());
    const std::vector<float> got = p.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      bad += !(std::fabs(got[i] - want[i]) <= std::nextafter(want[i], inf) - want[i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("cross_entropy with NaN logits follows the reference's argmax rule") {
  // The reference starts at class 0 and moves on only to a strictly greater value: a NaN
  // is the prediction only when it is class 0. 40 classes so lanes hold two values each.
  const int classes = 40, n = 6;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(650);
  auto logits = uniform(static_cast<std::size_t>(n) * classes, rng, -5.0f, 5.0f);
  auto at = [&](int i, int k) -> float& { return logits[static_cast<std::size_t>(i) * classes + k]; };
  at(0, 0) = nan;                        // NaN first: class 0 is the prediction
  at(1, 1) = nan, at(1, 7) = 9.0f;       // NaN in lane 1, maximum in another odd lane
  at(2, 33) = nan, at(2, 3) = 9.0f;      // NaN in a lane's second value
  for (int k = 0; k < classes; ++k) at(3, k) = nan;  // all NaN
  at(4, 5) = nan, at(4, 2) = 8.0f, at(4, 18) = 8.0f;  // tie behind a NaN: first wins
  // row 5: no NaN
  const std::vector<int32_t> labels = {0, 7, 3, 0, 2, 11};
  std::vector<float> dl_ref(logits.size()), loss_ref(n), corr_ref(n);
  ref::cross_entropy(n, n, classes, logits.data(), labels.data(), 1.0f, dl_ref.data(),
                     loss_ref.data(), corr_ref.data());
  DeviceArray<float> z(logits), dl(logits.size()), loss(n), corr(n);
  DeviceArray<int32_t> lab(labels);
  gpu::cross_entropy(n, n, classes, z.get(), lab.get(), 1.0f, dl.get(), loss.get(), corr.get());
  check_bits(corr.download(), corr_ref, "cross_entropy NaN rows: correct");
  check_close(loss.download(), loss_ref, 1e-5, 1e-6, "cross_entropy NaN rows: loss");
  check_close(dl.download(), dl_ref, 1e-5, 1e-6, "cross_entropy NaN rows: dlogits");
}

TEST_CASE("in-place ops (relu y == x, relu dx == dy, batchnorm dx == dy) match out of place") {
  std::mt19937 rng(660);
  {
    const int64_t n = 70001;
    const auto xh = quantised(static_cast<std::size_t>(n), rng, 7);
    const auto dyh = uniform(static_cast<std::size_t>(n), rng);
    DeviceArray<float> x(xh), y(xh.size()), dy(dyh), dx(xh.size()), inplace(xh), g(dyh);
    gpu::relu_forward(n, x.get(), y.get());
    gpu::relu_forward(n, inplace.get(), inplace.get());
    check_bits(inplace.download(), y.download(), "relu forward in place");
    gpu::relu_backward(n, y.get(), dy.get(), dx.get());
    gpu::relu_backward(n, y.get(), g.get(), g.get());
    check_bits(g.download(), dx.download(), "relu backward in place");
  }
  {
    const BatchNormShape s{16, 8, 49};
    const std::size_t total = static_cast<std::size_t>(s.n) * s.c * s.hw;
    const auto xh = uniform(total, rng), dyh = uniform(total, rng);
    const auto gh = uniform(8, rng, 0.5f, 1.5f), mh = uniform(8, rng), ih = uniform(8, rng, 0.5f, 2.0f);
    DeviceArray<float> x(xh), dy(dyh), g(gh), m(mh), inv(ih), dx(total), dg(8), db(8),
        inplace(dyh), dg2(8), db2(8);
    gpu::batchnorm_backward(s, x.get(), dy.get(), g.get(), m.get(), inv.get(), dx.get(), dg.get(),
                            db.get());
    gpu::batchnorm_backward(s, x.get(), inplace.get(), g.get(), m.get(), inv.get(), inplace.get(),
                            dg2.get(), db2.get());
    check_bits(inplace.download(), dx.download(), "batchnorm dx in place");
    check_bits(dg2.download(), dg.download(), "batchnorm dgamma (in-place call)");
    check_bits(db2.download(), db.download(), "batchnorm dbeta (in-place call)");
  }
}

TEST_CASE("reduce_sum matches the reference and is deterministic") {
  const int64_t sizes[] = {1, 255, 256, 1000, 262145, 1000003};
  std::mt19937 rng(700);
  for (int64_t n : sizes) {
    const auto xh = uniform(static_cast<std::size_t>(n), rng, 0.0f, 10.0f);
    const double want = ref::reduce_sum(n, xh.data());
    DeviceArray<float> x(xh);
    const double got = gpu::reduce_sum(n, x.get());
    // Both sum the same doubles (the floats, widened) in different orders: within
    // 2 gamma(n - 1) sum |x| of each other (reduction_bounds.h).
    double abs_sum = 0.0;
    for (float v : xh) abs_sum += std::fabs(v);
    const double bound = rb::order_difference(n, abs_sum);
    INFO("reduce_sum n=" << n << " got " << got << " want " << want << " bound " << bound);
    CHECK(std::fabs(got - want) <= bound);
    const double again = gpu::reduce_sum(n, x.get());
    CHECK(std::memcmp(&got, &again, sizeof(double)) == 0);
  }
  CHECK(gpu::reduce_sum(0, nullptr) == 0.0);
}

TEST_CASE("gather_batch matches the reference") {
  std::mt19937 rng(800);
  const int count = 50, pixels = 784, n = 32;
  std::uniform_int_distribution<int> byte(0, 255), pick(0, count - 1), cls(0, 9);
  std::vector<uint8_t> images(static_cast<std::size_t>(count) * pixels), labels(count);
  for (uint8_t& b : images) b = static_cast<uint8_t>(byte(rng));
  for (uint8_t& l : labels) l = static_cast<uint8_t>(cls(rng));
  std::vector<int32_t> indices(n);
  for (int32_t& i : indices) i = pick(rng);
  const float mean = 0.2860f, std = 0.3530f;
  std::vector<float> out_ref(static_cast<std::size_t>(n) * pixels);
  std::vector<int32_t> lab_ref(n);
  ref::gather_batch(n, pixels, images.data(), labels.data(), indices.data(), mean, std,
                    out_ref.data(), lab_ref.data());
  DeviceArray<uint8_t> im(images), lb(labels);
  DeviceArray<int32_t> idx(indices), lab_out(static_cast<std::size_t>(n));
  DeviceArray<float> out(out_ref.size());
  gpu::gather_batch(n, pixels, im.get(), lb.get(), idx.get(), mean, std, out.get(), lab_out.get());
  check_bits(out.download(), out_ref, "gather_batch pixels");  // same per-element math
  check_bits(lab_out.download(), lab_ref, "gather_batch labels");
}

// ---- Optimiser and loss scaling ---------------------------------------------------------

TEST_CASE("adam_update matches the reference") {
  struct Case {
    WeightDecayMode mode;
    float wd;
  };
  const Case cases[] = {{WeightDecayMode::Decoupled, 0.0f},
                        {WeightDecayMode::Decoupled, 0.01f},
                        {WeightDecayMode::L2, 0.01f}};
  std::mt19937 rng(900);
  const int64_t n = 4099;
  for (const Case& cs : cases) {
    AdamHyper h;
    h.weight_decay = cs.wd;
    h.decay = cs.mode;
    // Step factors as engine/optimizer.cpp computes them (host, double, rounded).
    const double t = 3, lr = 1e-3, beta1 = 0.9, beta2 = 0.999;
    AdamStepFactors f{};
    f.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
    f.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
    f.decay_factor = static_cast<float>(1.0 - lr * static_cast<double>(cs.wd));
    f.one_minus_beta1 = static_cast<float>(1.0 - beta1);
    f.one_minus_beta2 = static_cast<float>(1.0 - beta2);
    auto p_ref = uniform(static_cast<std::size_t>(n), rng);
    const auto g = uniform(static_cast<std::size_t>(n), rng);
    auto m_ref = uniform(static_cast<std::size_t>(n), rng, -0.1f, 0.1f);
    auto v_ref = uniform(static_cast<std::size_t>(n), rng, 0.0f, 0.01f);
    DeviceArray<float> p(p_ref), gd(g), m(m_ref), v(v_ref);
    ref::adam_update(n, p_ref.data(), g.data(), m_ref.data(), v_ref.data(), h, f);
    gpu::adam_update(n, p.get(), gd.get(), m.get(), v.get(), h, f);
    const std::string tag = "adam wd=" + std::to_string(cs.wd);
    // adam_element (kernels/elementwise.h) on both sides: the same bits.
    check_bits(p.download(), p_ref, tag + " param");
    check_bits(m.download(), m_ref, tag + " exp_avg");
    check_bits(v.download(), v_ref, tag + " exp_avg_sq");
  }
}

TEST_CASE("unscale_check scales, flags inf/NaN, never resets the flag") {
  std::mt19937 rng(1000);
  const int64_t n = 5000;
  const float inv_scale = 1.0f / 1024.0f;
  const auto g0 = uniform(static_cast<std::size_t>(n), rng, -100.0f, 100.0f);

  auto run = [&](std::vector<float> grads, int32_t flag_before, const char* what) {
    int32_t flag_ref = flag_before;
    std::vector<float> want = grads;
    ref::unscale_check(n, want.data(), inv_scale, &flag_ref);
    DeviceArray<float> g(grads);
    DeviceArray<int32_t> flag(std::vector<int32_t>{flag_before});
    gpu::unscale_check(n, g.get(), inv_scale, flag.get());
    INFO(what);
    // Finite and infinite values bit for bit; a NaN only has to stay a NaN (its sign
    // and payload after the multiply are the hardware's choice, not the maths').
    const std::vector<float> got = g.download();
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                            : std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
      bad += same ? 0 : 1;
    }
    INFO(what << " grads: " << bad << " of " << got.size() << " differ (NaN matches any NaN)");
    CHECK(bad == 0);
    CHECK(flag.download()[0] == flag_ref);
    return flag_ref;
  };
  CHECK(run(g0, 0, "finite") == 0);
  CHECK(run(g0, 1, "finite, flag already set") == 1);
  auto with_inf = g0;
  with_inf[4321] = std::numeric_limits<float>::infinity();
  CHECK(run(with_inf, 0, "inf") == 1);
  auto with_nan = g0;
  with_nan[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK(run(with_nan, 0, "NaN") == 1);
}

// ---- Determinism ------------------------------------------------------------------------

TEST_CASE("backward ops give identical bits when run twice") {
  std::mt19937 rng(1100);
  {  // A conv large enough that cuDNN would pick split/atomic algorithms if allowed.
    ConvShape s;
    s.n = 32, s.c = 16, s.h = 28, s.w = 28, s.k = 32, s.r = 3, s.s = 3, s.pad = 1;
    const ConvCase c = make_conv(s, 1101);
    DeviceArray<float> x(c.x), w(c.w), dy(c.dy), dx1(c.x.size()), dw1(c.w.size()),
        db1(c.b.size()), dx2(c.x.size()), dw2(c.w.size()), db2(c.b.size());
    gpu::conv2d_backward(s, x.get(), w.get(), dy.get(), dx1.get(), dw1.get(), db1.get());
    gpu::conv2d_backward(s, x.get(), w.get(), dy.get(), dx2.get(), dw2.get(), db2.get());
    check_bits(dx2.download(), dx1.download(), "conv dx twice");
    check_bits(dw2.download(), dw1.download(), "conv dw twice");
    check_bits(db2.download(), db1.download(), "conv db twice");
  }
  {
    const LinearShape s{256, 3136, 128};
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng);
    const auto wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng);
    const auto dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng);
    DeviceArray<float> x(xh), w(wh), dy(dyh), dx1(xh.size()), dw1(wh.size()), db1(128),
        dx2(xh.size()), dw2(wh.size()), db2(128);
    gpu::linear_backward(s, x.get(), w.get(), dy.get(), dx1.get(), dw1.get(), db1.get());
    gpu::linear_backward(s, x.get(), w.get(), dy.get(), dx2.get(), dw2.get(), db2.get());
    check_bits(dx2.download(), dx1.download(), "linear dx twice");
    check_bits(dw2.download(), dw1.download(), "linear dw twice");
    check_bits(db2.download(), db1.download(), "linear db twice");
  }
  {
    const BatchNormShape s{64, 32, 196};
    const std::size_t total = static_cast<std::size_t>(s.n) * s.c * s.hw;
    const auto xh = uniform(total, rng), dyh = uniform(total, rng);
    const auto gh = uniform(32, rng), mh = uniform(32, rng), ih = uniform(32, rng, 0.5f, 2.0f);
    DeviceArray<float> x(xh), dy(dyh), g(gh), m(mh), inv(ih), dx1(total), dg1(32), db1(32),
        dx2(total), dg2(32), db2(32);
    gpu::batchnorm_backward(s, x.get(), dy.get(), g.get(), m.get(), inv.get(), dx1.get(),
                            dg1.get(), db1.get());
    gpu::batchnorm_backward(s, x.get(), dy.get(), g.get(), m.get(), inv.get(), dx2.get(),
                            dg2.get(), db2.get());
    check_bits(dx2.download(), dx1.download(), "batchnorm dx twice");
    check_bits(dg2.download(), dg1.download(), "batchnorm dgamma twice");
    check_bits(db2.download(), db1.download(), "batchnorm dbeta twice");
    // Training statistics and output too, each call from the same running statistics
    // (mh and ih stand in for beta and the running variance).
    DeviceArray<float> rm1(mh), rv1(ih), rm2(mh), rv2(ih), sm1(32), si1(32), sm2(32), si2(32),
        y1(total), y2(total);
    gpu::batchnorm_forward_train(s, x.get(), g.get(), m.get(), 1e-5f, 0.1f, rm1.get(), rv1.get(),
                                 sm1.get(), si1.get(), y1.get());
    gpu::batchnorm_forward_train(s, x.get(), g.get(), m.get(), 1e-5f, 0.1f, rm2.get(), rv2.get(),
                                 sm2.get(), si2.get(), y2.get());
    check_bits(y2.download(), y1.download(), "batchnorm train y twice");
    check_bits(sm2.download(), sm1.download(), "batchnorm save_mean twice");
    check_bits(si2.download(), si1.download(), "batchnorm save_invstd twice");
    check_bits(rm2.download(), rm1.download(), "batchnorm running_mean twice");
    check_bits(rv2.download(), rv1.download(), "batchnorm running_var twice");
  }
  {
    const PoolShape s{32, 16, 28, 28};
    const std::size_t in_n = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    const auto xh = quantised(in_n, rng, 4), dyh = uniform(in_n / 4, rng);
    DeviceArray<float> x(xh), y(in_n / 4), dy(dyh), dx1(in_n), dx2(in_n);
    DeviceArray<int32_t> am(in_n / 4);
    gpu::maxpool2x2_forward(s, x.get(), y.get(), am.get());
    gpu::maxpool2x2_backward(s, dy.get(), am.get(), dx1.get());
    gpu::maxpool2x2_backward(s, dy.get(), am.get(), dx2.get());
    check_bits(dx2.download(), dx1.download(), "maxpool dx twice");
  }
  {  // The elementwise backward ops, for completeness.
    const int64_t n = 65537;
    const auto xh = uniform(static_cast<std::size_t>(n), rng);
    const auto dyh = uniform(static_cast<std::size_t>(n), rng);
    DeviceArray<float> x(xh), y(xh.size()), dy(dyh), dx1(xh.size()), dx2(xh.size());
    DeviceArray<uint8_t> keep(xh.size());
    gpu::relu_forward(n, x.get(), y.get());
    gpu::relu_backward(n, y.get(), dy.get(), dx1.get());
    gpu::relu_backward(n, y.get(), dy.get(), dx2.get());
    check_bits(dx2.download(), dx1.download(), "relu dx twice");
    gpu::dropout_forward(n, x.get(), 0.3f, PhiloxStream{11, 2}, 99, y.get(), keep.get());
    gpu::dropout_backward(n, dy.get(), keep.get(), 0.3f, dx1.get());
    gpu::dropout_backward(n, dy.get(), keep.get(), 0.3f, dx2.get());
    check_bits(dx2.download(), dx1.download(), "dropout dx twice");
  }
  {
    const int n = 256, classes = 10;
    const auto z = uniform(static_cast<std::size_t>(n) * classes, rng, -5.0f, 5.0f);
    std::vector<int32_t> labels(n);
    for (int i = 0; i < n; ++i) labels[i] = i % classes;
    DeviceArray<float> zd(z), dl1(z.size()), dl2(z.size()), loss(n), corr(n);
    DeviceArray<int32_t> lab(labels);
    gpu::cross_entropy(n, n, classes, zd.get(), lab.get(), 1.0f, dl1.get(), loss.get(), corr.get());
    gpu::cross_entropy(n, n, classes, zd.get(), lab.get(), 1.0f, dl2.get(), loss.get(), corr.get());
    check_bits(dl2.download(), dl1.download(), "cross_entropy dlogits twice");
  }
}
