// The bf16 reference (kernels/ref/mixed_precision.cpp) against the fp32 reference, on the
// CPU (no backend has the bf16 ops there), on every shape, with the bf16 product bound of
// tests/ops/harness.h (the fp16 bound scaled by 2^-8 / 2^-11): what CI holds of the bf16
// math without a GPU, beside the hand-worked cases of tests/test_bf16_rounding.cpp. The
// cuda cases of the bf16 ops, with the fp16 ones: cases_reduced_precision.cpp.
#include "kernels/bf16_math.h"
#include "ops/harness.h"

using namespace ops_test;

namespace {
// Every value is a bf16 value (a conv result before any bias).
void check_bf16_values(const std::string& what, const std::vector<float>& v) {
  std::vector<float> rounded(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) rounded[i] = engine::kernels::round_to_bf16(v[i]);
  check_bits(what, v, rounded);
}
}  // namespace

// ---- The bf16 reference against the fp32 reference (CPU) ----------------------------------

TEST_CASE("ref bf16 conv against the ref fp32 conv, every conv shape: the bf16 bound; db the fp32 bits") {
  uint32_t seed = 311;
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    std::mt19937 rng(seed++);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w, nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s,
                      ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const auto x = uniform(nx, rng), w = uniform(nw, rng, -0.5f, 0.5f), bias = uniform(s.k, rng), dy = uniform(ny, rng);
    std::vector<float> y_ref(ny), dx_ref(nx), dw_ref(nw), db_ref(s.k);
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), bias.data(), y_ref.data());
    ref::conv2d_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    std::vector<float> y(ny), y_nb(ny), dx(nx), dw(nw), db(s.k);
    ref::conv2d_forward(s, engine::Precision::Bf16, BatchSplit{}, x.data(), w.data(), bias.data(), y.data());
    ref::conv2d_forward(s, engine::Precision::Bf16, BatchSplit{}, x.data(), w.data(), nullptr, y_nb.data());
    ref::conv2d_backward(s, engine::Precision::Bf16, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    const double mx = magnitude(x), mw = magnitude(w), mdy = magnitude(dy);
    check_bf16("ref bf16 conv forward", y, y_ref, static_cast<int64_t>(s.c) * s.r * s.s, mx, mw, magnitude(bias));
    check_bf16("ref bf16 conv dx", dx, dx_ref, static_cast<int64_t>(s.k) * s.r * s.s, mw, mdy, 0.0);
    check_bf16("ref bf16 conv dw", dw, dw_ref, static_cast<int64_t>(s.n) * s.out_h() * s.out_w(), mx, mdy, 0.0);
    check_bits("ref bf16 conv db (from the fp32 dy)", db, db_ref);
    check_bf16_values("ref bf16 conv forward without bias", y_nb);
    check_bf16_values("ref bf16 conv dx", dx);
    check_bf16_values("ref bf16 conv dw", dw);
    // A null dx is left alone; dw and db are as with it.
    std::vector<float> dw2(nw), db2(s.k);
    ref::conv2d_backward(s, engine::Precision::Bf16, x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data());
    check_bits("ref bf16 conv dw (null dx)", dw2, dw);
    check_bits("ref bf16 conv db (null dx)", db2, db);
  }
}

TEST_CASE("ref bf16 linear against the ref fp32 linear, every linear shape: the bf16 bound; db the fp32 bits") {
  uint32_t seed = 411;
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    std::mt19937 rng(seed++);
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.in, rng),
               w = uniform(static_cast<std::size_t>(s.out) * s.in, rng, -0.1f, 0.1f), bias = uniform(s.out, rng),
               dy = uniform(static_cast<std::size_t>(s.n) * s.out, rng);
    std::vector<float> y_ref(dy.size()), dx_ref(x.size()), dw_ref(w.size()), db_ref(bias.size());
    ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), bias.data(), y_ref.data());
    ref::linear_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(bias.size());
    ref::linear_forward(s, engine::Precision::Bf16, BatchSplit{}, x.data(), w.data(), bias.data(), y.data());
    ref::linear_backward(s, engine::Precision::Bf16, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    const double mx = magnitude(x), mw = magnitude(w), mdy = magnitude(dy);
    check_bf16("ref bf16 linear forward", y, y_ref, s.in, mx, mw, magnitude(bias));
    check_bf16("ref bf16 linear dx", dx, dx_ref, s.out, mw, mdy, 0.0);
    check_bf16("ref bf16 linear dw", dw, dw_ref, s.n, mx, mdy, 0.0);
    check_bits("ref bf16 linear db (from the fp32 dy)", db, db_ref);
  }
}
