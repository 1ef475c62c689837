// The bf16 (mixed-precision) forms. On cuda, as the fp16 ones (tests/ops/cases_fp16.cpp):
// against the fp32 reference with the bf16 product bound of tests/ops/harness.h (the fp16
// bound scaled by 2^-8 / 2^-11); bias gradients stay fp32 (1e-4 of magnitude). And against
// the bf16 reference (kernels/ref/mixed_precision.cpp), which rounds the operands as the
// CUDA ops do: then only the library's summation order separates them (1e-4 of the
// magnitude), plus, where the result itself is rounded to bf16 (conv), one bf16 ulp
// (2^-7 relative).
//
// On the CPU (no backend has these ops there), the bf16 reference itself against the fp32
// reference, on every shape, with the same bound: what CI holds of the bf16 math without
// a GPU, beside the hand-worked cases of tests/test_bf16_rounding.cpp.
#include "kernels/bf16_math.h"
#include "ops/harness.h"

using namespace ops_test;

namespace {
enum class ResultRounding { Fp32, Bf16 };
void check_bf16_ref(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                    ResultRounding rounding) {
  const double ulp = rounding == ResultRounding::Bf16 ? 1.0 / 128.0 : 0.0;
  check_rel(what, got, want, ulp, 1e-4 * std::max(1.0, magnitude(want)));
}
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
    ref::conv2d_forward(s, x.data(), w.data(), bias.data(), y_ref.data());
    ref::conv2d_backward(s, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    std::vector<float> y(ny), y_nb(ny), dx(nx), dw(nw), db(s.k);
    ref::conv2d_forward_bf16(s, x.data(), w.data(), bias.data(), y.data());
    ref::conv2d_forward_bf16(s, x.data(), w.data(), nullptr, y_nb.data());
    ref::conv2d_backward_bf16(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
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
    ref::conv2d_backward_bf16(s, x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data());
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
    ref::linear_forward(s, x.data(), w.data(), bias.data(), y_ref.data());
    ref::linear_backward(s, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(bias.size());
    ref::linear_forward_bf16(s, x.data(), w.data(), bias.data(), y.data());
    ref::linear_backward_bf16(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    const double mx = magnitude(x), mw = magnitude(w), mdy = magnitude(dy);
    check_bf16("ref bf16 linear forward", y, y_ref, s.in, mx, mw, magnitude(bias));
    check_bf16("ref bf16 linear dx", dx, dx_ref, s.out, mw, mdy, 0.0);
    check_bf16("ref bf16 linear dw", dw, dw_ref, s.n, mx, mdy, 0.0);
    check_bits("ref bf16 linear db (from the fp32 dy)", db, db_ref);
  }
}

// ---- cuda against the references ------------------------------------------------------

OP_CASE("every conv shape, with and without bias; dx null (dx untouched)", conv2d_forward_bf16, conv2d_backward_bf16) {
  uint32_t seed = 511;
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    std::mt19937 rng(seed++);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w, nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s,
                      ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const auto xh = uniform(nx, rng), wh = uniform(nw, rng, -0.5f, 0.5f), bh = uniform(s.k, rng), dyh = uniform(ny, rng);
    std::vector<float> y_ref(ny), y_nb(ny), dx_ref(nx), dw_ref(nw), db_ref(s.k);
    ref::conv2d_forward(s, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::conv2d_forward(s, xh.data(), wh.data(), nullptr, y_nb.data());
    ref::conv2d_backward(s, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);
    const int64_t k_fwd = static_cast<int64_t>(s.c) * s.r * s.s, k_dx = static_cast<int64_t>(s.k) * s.r * s.s,
                  k_dw = static_cast<int64_t>(s.n) * s.out_h() * s.out_w();
    Mem m(b);
    const float *x = m.in(xh), *w = m.in(wh), *dy = m.in(dyh);
    float *y = m.out<float>(ny), *y2 = m.out<float>(ny), *dx = m.out<float>(nx), *dw = m.out<float>(nw),
          *db = m.out<float>(s.k);
    std::vector<float> y16_ref(ny), dx16_ref(nx), dw16_ref(nw), db16_ref(s.k);
    ref::conv2d_forward_bf16(s, xh.data(), wh.data(), bh.data(), y16_ref.data());
    ref::conv2d_backward_bf16(s, xh.data(), wh.data(), dyh.data(), dx16_ref.data(), dw16_ref.data(), db16_ref.data());
    b.ops->conv2d_forward_bf16(s, x, w, m.in(bh), y);
    check_bf16("bf16 conv forward", m.get(y), y_ref, k_fwd, mx, mw, mb);
    check_bf16_ref("bf16 conv forward against the bf16 reference", m.get(y), y16_ref, ResultRounding::Bf16);
    b.ops->conv2d_forward_bf16(s, x, w, nullptr, y2);
    check_bf16("bf16 conv forward (no bias)", m.get(y2), y_nb, k_fwd, mx, mw, 0.0);
    b.ops->conv2d_backward_bf16(s, x, w, dy, dx, dw, db);
    check_bf16("bf16 conv dx", m.get(dx), dx_ref, k_dx, mw, mdy, 0.0);
    const auto dw1 = m.get(dw), db1 = m.get(db);
    check_bf16("bf16 conv dw", dw1, dw_ref, k_dw, mx, mdy, 0.0);
    check_bf16_ref("bf16 conv dx against the bf16 reference", m.get(dx), dx16_ref, ResultRounding::Bf16);
    check_bf16_ref("bf16 conv dw against the bf16 reference", dw1, dw16_ref, ResultRounding::Bf16);
    check_gemm_like("bf16 conv db against the bf16 reference", db1, db16_ref);
    check_gemm_like("bf16 conv db", db1, db_ref);
    float *dx2 = m.out<float>(nx), *dw2 = m.out<float>(nw), *db2 = m.out<float>(s.k);
    b.ops->conv2d_backward_bf16(s, x, w, dy, nullptr, dw2, db2);
    check_bits("bf16 conv dw repeat (null dx)", m.get(dw2), dw1);
    check_bits("bf16 conv db repeat (null dx)", m.get(db2), db1);
    check_bits("bf16 conv dx untouched when null", m.get(dx2), Mem::poison<float>(nx));
  }
}

OP_CASE("every linear shape; dx and db null; no input features gives the bias", linear_forward_bf16,
        linear_backward_bf16) {
  uint32_t seed = 611;
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    std::mt19937 rng(seed++);
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng), wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, -0.1f, 0.1f),
               bh = uniform(s.out, rng), dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng);
    std::vector<float> y_ref(dyh.size()), dx_ref(xh.size()), dw_ref(wh.size()), db_ref(bh.size());
    ref::linear_forward(s, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::linear_backward(s, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);
    Mem m(b);
    const float *x = m.in(xh), *w = m.in(wh), *dy = m.in(dyh);
    float *y = m.out<float>(dyh.size()), *dx = m.out<float>(xh.size()), *dw = m.out<float>(wh.size()),
          *db = m.out<float>(bh.size());
    b.ops->linear_forward_bf16(s, x, w, m.in(bh), y);
    b.ops->linear_backward_bf16(s, x, w, dy, dx, dw, db);
    std::vector<float> y16_ref(dyh.size()), dx16_ref(xh.size()), dw16_ref(wh.size()), db16_ref(bh.size());
    ref::linear_forward_bf16(s, xh.data(), wh.data(), bh.data(), y16_ref.data());
    ref::linear_backward_bf16(s, xh.data(), wh.data(), dyh.data(), dx16_ref.data(), dw16_ref.data(),
                              db16_ref.data());
    check_bf16_ref("bf16 linear forward against the bf16 reference", m.get(y), y16_ref, ResultRounding::Fp32);
    check_bf16_ref("bf16 linear dx against the bf16 reference", m.get(dx), dx16_ref, ResultRounding::Fp32);
    check_bf16_ref("bf16 linear dw against the bf16 reference", m.get(dw), dw16_ref, ResultRounding::Fp32);
    check_bf16("bf16 linear forward", m.get(y), y_ref, s.in, mx, mw, mb);
    check_bf16("bf16 linear dx", m.get(dx), dx_ref, s.out, mw, mdy, 0.0);
    const auto dw1 = m.get(dw);
    check_bf16("bf16 linear dw", dw1, dw_ref, s.n, mx, mdy, 0.0);
    check_gemm_like("bf16 linear db", m.get(db), db_ref);
    float *dx2 = m.out<float>(xh.size()), *dw2 = m.out<float>(wh.size());
    b.ops->linear_backward_bf16(s, x, w, dy, nullptr, dw2, nullptr);
    check_bits("bf16 linear dw repeat (null dx)", m.get(dw2), dw1);
    check_bits("bf16 linear dx untouched when null", m.get(dx2), Mem::poison<float>(xh.size()));
  }
  const LinearShape s{3, 0, 4};
  const std::vector<float> bh = {1.0f, -2.0f, 0.5f, 3.0f};
  Mem m(b);
  float *y = m.out<float>(12), *db = m.out<float>(4);
  b.ops->linear_forward_bf16(s, nullptr, nullptr, m.in(bh), y);
  std::vector<float> want;
  for (int i = 0; i < s.n; ++i) want.insert(want.end(), bh.begin(), bh.end());
  check_bits("linear in=0 forward", m.get(y), want);
  b.ops->linear_backward_bf16(s, nullptr, nullptr, m.in(std::vector<float>(12, 1.0f)), nullptr, nullptr, db);
  check_bits("linear in=0 db", m.get(db), std::vector<float>(4, 3.0f));
}

// Each chunk computed by the whole-batch bf16 op: the chunked bf16 ops against the fp32
// reference chunked ops with the bf16 bound; the bias tree (fp32 dy, double) as in fp32.
OP_CASE("against the ref chunked ops, every chunk shape", conv2d_forward_chunks_bf16, conv2d_backward_chunks_bf16,
        linear_forward_chunks_bf16, linear_backward_chunks_bf16) {
  std::mt19937 g(19);
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    if (!kConvShapes[t].chunks) continue;
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    const ChunkedLayerCase c = chunked_case(s, g, 0.5f);
    const std::vector<int>& bd = c.bounds;
    Mem m(b);
    float *y = m.out<float>(c.dy.size()), *dx = m.out<float>(c.x.size()), *dw = m.out<float>(c.w.size());
    double* db = m.out<double>(s.k);
    const float *xd = m.in(c.x), *wd = m.in(c.w);
    b.ops->conv2d_forward_chunks_bf16(s, kTreeChunks, bd.data(), xd, wd, m.in(c.bias), y);
    b.ops->conv2d_backward_chunks_bf16(s, kTreeChunks, bd.data(), xd, wd, m.in(c.dy), dx, dw, db);
    const double mx = magnitude(c.x), mw = magnitude(c.w), mdy = magnitude(c.dy);
    check_bf16("bf16 chunks conv y", m.get(y), c.y_ref, static_cast<int64_t>(s.c) * s.r * s.s, mx, mw,
               magnitude(c.bias));
    check_bf16("bf16 chunks conv dx", m.get(dx), c.dx_ref, static_cast<int64_t>(s.k) * s.r * s.s, mw, mdy, 0.0);
    check_bf16("bf16 chunks conv dw", m.get(dw), c.dw_ref, static_cast<int64_t>(s.n) * s.out_h() * s.out_w(), mx,
               mdy, 0.0);
    const double scale = 2.0 * 0x1p-24 * sum_abs(c.dy);
    check_close("bf16 chunks conv db", m.get(db), c.db_ref, [&](std::size_t) { return scale; });
  }
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    if (!kLinearShapes[t].chunks) continue;
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    const ChunkedLayerCase c = chunked_case(s, g, 0.1f);
    const std::vector<int>& bd = c.bounds;
    Mem m(b);
    float *y = m.out<float>(c.dy.size()), *dx = m.out<float>(c.x.size()), *dw = m.out<float>(c.w.size());
    double* db = m.out<double>(s.out);
    const float *xd = m.in(c.x), *wd = m.in(c.w);
    b.ops->linear_forward_chunks_bf16(s, kTreeChunks, bd.data(), xd, wd, m.in(c.bias), y);
    b.ops->linear_backward_chunks_bf16(s, kTreeChunks, bd.data(), xd, wd, m.in(c.dy), dx, dw, db);
    const double mx = magnitude(c.x), mw = magnitude(c.w), mdy = magnitude(c.dy);
    check_bf16("bf16 chunks linear y", m.get(y), c.y_ref, s.in, mx, mw, magnitude(c.bias));
    check_bf16("bf16 chunks linear dx", m.get(dx), c.dx_ref, s.out, mw, mdy, 0.0);
    check_bf16("bf16 chunks linear dw", m.get(dw), c.dw_ref, s.n, mx, mdy, 0.0);
    const double scale = 2.0 * 0x1p-24 * sum_abs(c.dy);
    check_close("bf16 chunks linear db", m.get(db), c.db_ref, [&](std::size_t) { return scale; });
  }
}
