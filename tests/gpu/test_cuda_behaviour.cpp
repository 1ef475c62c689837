// CUDA behaviour tests that are not comparisons of an op with ref:: (those live in the
// backend-comparison harness, tests/ops/, run on cuda by gpu_test_ops): the runtime's
// copies and memset; device Philox against the host and cuRAND; fp32 <-> fp16 and bf16 casts;
// the non-deterministic (timed) algorithm choice of cuDNN, fp32 and fp16; backward ops
// giving the same bits when run twice; fp16 overflow to inf; FashionCnn in fp16 against
// fp32; layers at W = 2 by threads on one GPU against W = 1; and the refusal of
// cuda.batch_chunks=false with several ranks.
//
// Each section keeps its own small helpers (namespaces cuda_runtime_part, fp16_part,
// layers_part). Tolerances, where a section compares values:
//  * the timed conv reruns: cuDNN convolutions within 1e-4 of the output's magnitude
//    (the algorithm, and so its error, is the library's choice); fp16 as in
//    tests/ops/harness.h: 2e-3 sqrt(K) max|a| max|b| + 1e-3 |want| (+ 1e-3 max|bias|),
//    bias gradients (fp32) 1e-4 of their magnitude;
//  * "beyond 65504": same-sign terms, so 2e-3 of the sum itself;
//  * FashionCnn (4 stacked fp16 layers, fp32 BatchNorm between): logits within 1e-2 of
//    the largest |logit| (a CPU emulation of the fp16 path gave <= 1e-3); parameter
//    gradients in relative L2 norm, see the test (its MESSAGE lines log the margins);
//  * everything else bit for bit.
//
// Exits with 77 (CTest: skipped) when the build has no CUDA backend or the machine
// has no GPU (gpu/device_test_util.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <ios>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/batch_chunks.h"
#include "engine/core/collective.h"
#include "engine/core/device.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/kernels/philox.h"
#include "engine/nn/layers.h"
#include "engine/nn/models/fashion_cnn.h"
#include "gpu/device_test_util.h"
#include "kernels/chunk_tree.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"
#include "support/random_data.h"
#include "support/thread_collective.h"

#if defined(ENGINE_WITH_CUDA)
#include "gpu/philox_check.h"
#include "kernels/bf16_math.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/settings.h"
#endif

namespace gpu = engine::kernels::cuda;
namespace ref = engine::kernels::ref;
using engine::PhiloxStream;
using engine::kernels::BatchNormShape;
using engine::kernels::BatchSplit;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;
using engine::kernels::PoolShape;
using gpu_test::DeviceArray;

// ---- Shared by every part ----------------------------------------------------------------

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
// of mismatches, the first one, and the largest error relative to `abs` (so the margin
// shows in logs).
void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 double abs, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double err = std::fabs(g - w);
    const bool ok = (std::isnan(g) && std::isnan(w)) || err <= abs + rel * std::fabs(w);
    if (abs > 0 && std::isfinite(err)) worst = std::max(worst, err / abs);
    if (!ok && bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " differ; first at " << first << ": got "
            << (bad ? got[first] : 0.0f) << ", want " << (bad ? want[first] : 0.0f)
            << " (abs tolerance " << abs << ", largest error / abs tolerance " << worst << ")");
  CHECK(bad == 0);
}

// Convolutions and GEMMs: error within 1e-4 of the output's largest magnitude.
void check_gemm_like(const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
  check_close(got, want, 0.0, 1e-4 * std::max(1.0, magnitude(want)), what);
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

// =========================================================================================
// Runtime, Philox, casts, the timed fp32 conv algorithm choice, determinism
// =========================================================================================

namespace cuda_runtime_part {

namespace {

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

TEST_CASE("casts: fp32 <-> bf16, bit for bit as kernels/bf16_math.h rounds (the reference's rounding)") {
  using engine::kernels::bf16_bits_from_f32;
  using engine::kernels::f32_bits;
  using engine::kernels::f32_from_bits;
  // Ties at 1 and past the largest bf16, subnormals, infinities, then random bit patterns.
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 257.0f, 70000.0f,
                               std::numeric_limits<float>::max(), f32_from_bits(0x7f7f7fffu),
                               f32_from_bits(0x7f7f8000u), f32_from_bits(0x00018000u),
                               std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(40);
  for (int i = 0; i < 4096; ++i) values.push_back(f32_from_bits(static_cast<uint32_t>(rng())));
  const int64_t n = static_cast<int64_t>(values.size());
  DeviceArray<float> in(values), back(values.size());
  DeviceArray<uint16_t> bf16(values.size());
  gpu::cast_f32_to_bf16(n, in.get(), bf16.get());
  gpu::cast_bf16_to_f32(n, bf16.get(), back.get());
  const std::vector<uint16_t> bits = bf16.download();
  const std::vector<float> widened = back.download();
  int bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {  // any NaN: CUDA's is its canonical one
      if (!std::isnan(widened[i]) && bad++ == 0) FAIL_CHECK("NaN at " << i << " did not stay NaN");
      continue;
    }
    const uint16_t want = bf16_bits_from_f32(values[i]);
    if ((bits[i] != want || f32_bits(widened[i]) != static_cast<uint32_t>(want) << 16) && bad++ == 0)
      FAIL_CHECK("bf16 cast of " << values[i] << " (index " << i << "): got 0x" << std::hex << bits[i]
                                 << " want 0x" << want);
  }
  CHECK(bad == 0);
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
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, c.x.data(), c.w.data(), c.b.data(), y_ref.data());
    ref::conv2d_backward(s, engine::Precision::Fp32, c.x.data(), c.w.data(), c.dy.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());

    DeviceArray<float> x(c.x), w(c.w), b(c.b), dy(c.dy), y(c.dy.size()), dx(c.x.size()),
        dw(c.w.size()), db(c.b.size());
    y.poison();
    dx.poison();
    dw.poison();
    db.poison();
    gpu::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.get(), w.get(), b.get(), y.get());
    check_gemm_like(y.download(), y_ref, tag + " forward");

    gpu::conv2d_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
    check_gemm_like(dx.download(), dx_ref, tag + " dx");
    check_gemm_like(dw.download(), dw_ref, tag + " dw");
    check_gemm_like(db.download(), db_ref, tag + " db");

    // Without dx (first layer): dw and db still right, dx untouched.
    dw.poison();
    db.poison();
    dx.poison();
    gpu::conv2d_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), nullptr, dw.get(), db.get());
    check_gemm_like(dw.download(), dw_ref, tag + " dw (null dx)");
    check_gemm_like(db.download(), db_ref, tag + " db (null dx)");
    std::vector<float> junk(c.x.size());
    std::memset(junk.data(), 0x7f, junk.size() * sizeof(float));
    check_bits(dx.download(), junk, tag + " dx untouched when null");
  }
}

}  // namespace

#if defined(ENGINE_WITH_CUDA)
TEST_CASE("conv2d with non-deterministic (timed) algorithm choice") {
  gpu::set_deterministic(false);
  run_conv_checks("fastest");
  gpu::set_deterministic(true);
  CHECK(gpu::deterministic());
}
#endif

// ---- Determinism ------------------------------------------------------------------------

TEST_CASE("backward ops give identical bits when run twice") {
  std::mt19937 rng(1100);
  {  // A conv large enough that cuDNN would pick split/atomic algorithms if allowed.
    ConvShape s;
    s.n = 32, s.c = 16, s.h = 28, s.w = 28, s.k = 32, s.r = 3, s.s = 3, s.pad = 1;
    const ConvCase c = make_conv(s, 1101);
    DeviceArray<float> x(c.x), w(c.w), dy(c.dy), dx1(c.x.size()), dw1(c.w.size()),
        db1(c.b.size()), dx2(c.x.size()), dw2(c.w.size()), db2(c.b.size());
    gpu::conv2d_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), dx1.get(), dw1.get(), db1.get());
    gpu::conv2d_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), dx2.get(), dw2.get(), db2.get());
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
    gpu::linear_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), dx1.get(), dw1.get(), db1.get());
    gpu::linear_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), dx2.get(), dw2.get(), db2.get());
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
    gpu::batchnorm_backward(s, BatchSplit{}, x.get(), dy.get(), g.get(), m.get(), inv.get(), dx1.get(),
                            dg1.get(), db1.get());
    gpu::batchnorm_backward(s, BatchSplit{}, x.get(), dy.get(), g.get(), m.get(), inv.get(), dx2.get(),
                            dg2.get(), db2.get());
    check_bits(dx2.download(), dx1.download(), "batchnorm dx twice");
    check_bits(dg2.download(), dg1.download(), "batchnorm dgamma twice");
    check_bits(db2.download(), db1.download(), "batchnorm dbeta twice");
    // Training statistics and output too, each call from the same running statistics
    // (mh and ih stand in for beta and the running variance).
    DeviceArray<float> rm1(mh), rv1(ih), rm2(mh), rv2(ih), sm1(32), si1(32), sm2(32), si2(32),
        y1(total), y2(total);
    gpu::batchnorm_forward_train(s, BatchSplit{}, x.get(), g.get(), m.get(), 1e-5f, 0.1f, rm1.get(), rv1.get(),
                                 sm1.get(), si1.get(), y1.get());
    gpu::batchnorm_forward_train(s, BatchSplit{}, x.get(), g.get(), m.get(), 1e-5f, 0.1f, rm2.get(), rv2.get(),
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
    DeviceArray<uint64_t> counter(std::vector<uint64_t>{90});
    gpu::dropout_forward(n, x.get(), 0.3f, PhiloxStream{11, 2}, counter.get(), 9, y.get(), keep.get());
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
    DeviceArray<float> scale(std::vector<float>{1.0f});
    DeviceArray<int64_t> first(std::vector<int64_t>{0});
    gpu::cross_entropy(n, n, classes, zd.get(), lab.get(), scale.get(), first.get(), dl1.get(), loss.get(), corr.get());
    gpu::cross_entropy(n, n, classes, zd.get(), lab.get(), scale.get(), first.get(), dl2.get(), loss.get(), corr.get());
    check_bits(dl2.download(), dl1.download(), "cross_entropy dlogits twice");
  }
}

}  // namespace cuda_runtime_part

// =========================================================================================
// fp16: the timed algorithm choice, overflow, FashionCnn
// =========================================================================================

#if defined(ENGINE_WITH_CUDA)

namespace fp16_part {

namespace {

// The fp16 product bound from the header: K terms of a*b.
void check_f16(const std::vector<float>& got, const std::vector<float>& want, int64_t k,
               double max_a, double max_b, double max_bias, const std::string& what) {
  const double abs = 2e-3 * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1))) * max_a *
                         max_b + 1e-3 * max_bias + 1e-30;
  check_close(got, want, 1e-3, abs, what);
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
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::conv2d_backward(s, engine::Precision::Fp32, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);
    const int64_t k_fwd = static_cast<int64_t>(s.c) * s.r * s.s;
    const int64_t k_dx = static_cast<int64_t>(s.k) * s.r * s.s;
    const int64_t k_dw = static_cast<int64_t>(s.n) * s.out_h() * s.out_w();

    DeviceArray<float> x(xh), w(wh), b(bh), dy(dyh), y(dyh.size()), dx(xh.size()), dw(wh.size()),
        db(bh.size());
    y.poison();
    dx.poison();
    dw.poison();
    db.poison();
    gpu::conv2d_forward(s, engine::Precision::Fp16, BatchSplit{}, x.get(), w.get(), b.get(), y.get());
    check_f16(y.download(), y_ref, k_fwd, mx, mw, mb, tag + " forward");

    gpu::conv2d_backward(s, engine::Precision::Fp16, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
    const auto dx1 = dx.download(), dw1 = dw.download(), db1 = db.download();
    check_f16(dx1, dx_ref, k_dx, mw, mdy, 0.0, tag + " dx");
    check_f16(dw1, dw_ref, k_dw, mx, mdy, 0.0, tag + " dw");
    check_gemm_like(db1, db_ref, tag + " db");

    // Again without dx (first layer) and into poisoned outputs: the same bits (the
    // deterministic setting holds for fp16 too in "deterministic" mode), dx untouched.
    dx.poison();
    dw.poison();
    db.poison();
    gpu::conv2d_backward(s, engine::Precision::Fp16, x.get(), w.get(), dy.get(), nullptr, dw.get(), db.get());
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
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, xh.data(), wh.data(), nullptr, y_nobias_ref.data());
    gpu::conv2d_forward(s, engine::Precision::Fp16, BatchSplit{}, x.get(), w.get(), nullptr, y.get());
    check_f16(y.download(), y_nobias_ref, k_fwd, mx, mw, 0.0, tag + " forward (no bias)");
  }
}

}  // namespace

TEST_CASE("fp16 conv2d with non-deterministic (timed) algorithm choice") {
  gpu::set_deterministic(false);
  run_conv_f16_checks("fastest");
  gpu::set_deterministic(true);
  CHECK(gpu::deterministic());
}

// ---- Linear -----------------------------------------------------------------------------

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
  DeviceArray<float> x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size()), db(static_cast<std::size_t>(s.k));
  gpu::conv2d_backward(s, engine::Precision::Fp16, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
  check_all_pos_inf(dx.download(), "conv fp16 dx beyond 65504");
  check_all_pos_inf(dw.download(), "conv fp16 dw beyond 65504");
  check_all_finite(db.download(), "conv fp16 db (fp32 sum)");
  // The fp32 op on the same data: finite (the infs come from fp16, not the data).
  gpu::conv2d_backward(s, engine::Precision::Fp32, x.get(), w.get(), dy.get(), dx.get(), dw.get(), db.get());
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
    DeviceArray<float> x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size());
    gpu::conv2d_backward(s, engine::Precision::Fp16, x.get(), w.get(), dy.get(), dx.get(), dw.get(), nullptr);
    check_all_nonfinite(dx.download(), "conv fp16 dx from overflowing dy");
    check_all_nonfinite(dw.download(), "conv fp16 dw from overflowing dy");
  }
  {
    const LinearShape s{16, 96, 24};
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng, 0.5f, 1.0f);
    const auto wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, 0.5f, 1.0f);
    auto dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng, 0.5f, 1.0f);
    for (float& v : dyh) v *= 6e4f * scale;
    DeviceArray<float> x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size());
    gpu::linear_backward(s, engine::Precision::Fp16, x.get(), w.get(), dy.get(), dx.get(), dw.get(), nullptr);
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
  ref::linear_backward(s, engine::Precision::Fp32, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(), nullptr);
  CHECK(magnitude(dx_ref) > 65504.0);
  DeviceArray<float> x(xh), w(wh), dy(dyh), dx(xh.size()), dw(wh.size());
  gpu::linear_backward(s, engine::Precision::Fp16, x.get(), w.get(), dy.get(), dx.get(), dw.get(), nullptr);
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


}  // namespace fp16_part

#endif  // ENGINE_WITH_CUDA

// =========================================================================================
// Layers at W = 2 by threads; cuda.batch_chunks=false with several ranks
// =========================================================================================

namespace layers_part {

using test_support::uniform;

namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

// ---- Layers at W = 2 by threads on one GPU ---------------------------------------------

namespace {

// conv -> batch norm -> ReLU -> flatten -> linear on this rank's share of a batch; the
// outputs of its samples and every gradient, on the host.
struct LayerRun {
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;
};
LayerRun run_layers(const std::vector<float>& batch, int n, engine::Collective* comm) {
  using namespace engine;
  Conv2d conv("conv", 1, 4, 3, 1);
  BatchNorm2d bn("bn", 4);
  ReLU relu("relu");
  Flatten flat("flat");
  Linear fc("fc", 4 * 8 * 8, 10);
  Rng init(42);
  conv.reset_parameters(init);
  fc.reset_parameters(init);
  const Device d = Device::cuda(0);
  conv.to(d);
  bn.to(d);
  fc.to(d);
  const BatchChunks plan(n, comm);
  std::vector<Layer*> layers{&conv, &bn, &relu, &flat, &fc};
  for (Layer* l : layers) l->set_batch_chunks(&plan);
  const int local = plan.local_count();
  std::vector<float> mine(batch.begin() + plan.local_begin() * 64, batch.begin() + (plan.local_begin() + local) * 64);
  Tensor x = Tensor::from_vector({local, 1, 8, 8}, mine).to(d);
  Rng rng(1);
  for (Layer* l : layers) x = l->forward(x, Mode::Train, rng);
  LayerRun out;
  out.logits = x.to(Device::cpu()).to_vector();
  Tensor g = x;  // d(sum of logits) / d logits = 1: a fixed upstream gradient
  g = Tensor::from_vector(x.shape(), std::vector<float>(static_cast<std::size_t>(x.numel()), 1.0f)).to(d);
  for (int i = static_cast<int>(layers.size()) - 1; i >= 0; --i)
    g = layers[i]->backward(g, i == 0 ? InputGrad::NotNeeded : InputGrad::Needed);
  for (Layer* l : layers)
    for (Parameter* p : l->parameters()) out.grads.push_back(p->grad.to(Device::cpu()).to_vector());
  for (Layer* l : layers) l->set_batch_chunks(nullptr);
  return out;
}

}  // namespace

TEST_CASE("CUDA layers at W = 2 by threads on one GPU give the bits of W = 1") {
  gpu::set_batch_chunks(true);  // the chunked path (off by default until it has run on a GPU)
  std::mt19937 g(9);
  const int n = 22;
  const std::vector<float> batch = uniform(static_cast<std::size_t>(n) * 64, g);
  const LayerRun one = run_layers(batch, n, nullptr);
  std::vector<LayerRun> runs(2);
  test_support::run_ranks(2, [&](int r, engine::Collective& c) { runs[r] = run_layers(batch, n, &c); });
  std::vector<float> joined = runs[0].logits;
  joined.insert(joined.end(), runs[1].logits.begin(), runs[1].logits.end());
  CHECK(same_bits(joined, one.logits));
  for (int r = 0; r < 2; ++r) {
    REQUIRE(runs[r].grads.size() == one.grads.size());
    for (std::size_t i = 0; i < one.grads.size(); ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(same_bits(runs[r].grads[i], one.grads[i]));
    }
  }
}

namespace {
// Rank 0 of 2 that is never asked to exchange (the layer refuses before any exchange).
class IdleTwoRanks final : public engine::Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "idle"; }
  void allgather(const void*, std::size_t, void*) override { throw std::logic_error("no exchange expected"); }
  void broadcast(void*, std::size_t, int) override { throw std::logic_error("no exchange expected"); }
};
}  // namespace

TEST_CASE("cuda.batch_chunks=false is refused with several ranks, and used in one process") {
  using namespace engine;
  Conv2d conv("conv1", 1, 2, 3, 1);
  Rng init(1);
  conv.reset_parameters(init);
  conv.to(Device::cuda(0));
  Tensor x = Tensor::zeros({4, 1, 8, 8}, DType::F32, Device::cuda(0));
  IdleTwoRanks two;
  const BatchChunks plan(8, &two);  // rank 0 of 2 holds 4 of the 8 samples
  conv.set_batch_chunks(&plan);
  Rng rng(2);
  gpu::set_batch_chunks(false);
  std::string message;
  try {
    conv.forward(x, Mode::Train, rng);
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  CHECK(message == "conv1: cuda.batch_chunks=false computes whole batches, which needs one process; this run has 2 "
                   "ranks (set cuda.batch_chunks=true)");
  const BatchChunks one(4);
  conv.set_batch_chunks(&one);
  CHECK_NOTHROW(conv.forward(x, Mode::Train, rng));
  gpu::set_batch_chunks(false);  // the default
  conv.set_batch_chunks(nullptr);
}

}  // namespace layers_part
