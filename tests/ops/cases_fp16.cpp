// The fp16 (mixed-precision) forms, cuda only: against the fp32 reference with the fp16
// product bound of tests/ops/harness.h; bias gradients stay fp32 (1e-4 of magnitude).
// And against the fp16 reference (kernels/ref/mixed_precision.cpp), which rounds the
// operands as the CUDA ops do: then only the library's summation order separates them
// (1e-4 of the magnitude, as the fp32 cuDNN and cuBLAS ops), plus, where the result
// itself is rounded to fp16 (conv), one fp16 ulp (2^-10 relative).
#include "ops/harness.h"

using namespace ops_test;

namespace {
enum class ResultRounding { Fp32, Fp16 };
void check_f16_ref(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                   ResultRounding rounding) {
  const double ulp = rounding == ResultRounding::Fp16 ? 1.0 / 1024.0 : 0.0;
  check_rel(what, got, want, ulp, 1e-4 * std::max(1.0, magnitude(want)));
}
}  // namespace

OP_CASE("every conv shape, with and without bias; dx null (dx untouched)", conv2d_forward_f16, conv2d_backward_f16) {
  uint32_t seed = 11;
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
    ref::conv2d_forward_f16(s, xh.data(), wh.data(), bh.data(), y16_ref.data());
    ref::conv2d_backward_f16(s, xh.data(), wh.data(), dyh.data(), dx16_ref.data(), dw16_ref.data(), db16_ref.data());
    b.ops->conv2d_forward_f16(s, x, w, m.in(bh), y);
    check_f16("fp16 conv forward", m.get(y), y_ref, k_fwd, mx, mw, mb);
    check_f16_ref("fp16 conv forward against the fp16 reference", m.get(y), y16_ref, ResultRounding::Fp16);
    b.ops->conv2d_forward_f16(s, x, w, nullptr, y2);
    check_f16("fp16 conv forward (no bias)", m.get(y2), y_nb, k_fwd, mx, mw, 0.0);
    b.ops->conv2d_backward_f16(s, x, w, dy, dx, dw, db);
    check_f16("fp16 conv dx", m.get(dx), dx_ref, k_dx, mw, mdy, 0.0);
    const auto dw1 = m.get(dw), db1 = m.get(db);
    check_f16("fp16 conv dw", dw1, dw_ref, k_dw, mx, mdy, 0.0);
    check_f16_ref("fp16 conv dx against the fp16 reference", m.get(dx), dx16_ref, ResultRounding::Fp16);
    check_f16_ref("fp16 conv dw against the fp16 reference", dw1, dw16_ref, ResultRounding::Fp16);
    check_gemm_like("fp16 conv db against the fp16 reference", db1, db16_ref);
    check_gemm_like("fp16 conv db", db1, db_ref);
    float *dx2 = m.out<float>(nx), *dw2 = m.out<float>(nw), *db2 = m.out<float>(s.k);
    b.ops->conv2d_backward_f16(s, x, w, dy, nullptr, dw2, db2);
    check_bits("fp16 conv dw repeat (null dx)", m.get(dw2), dw1);
    check_bits("fp16 conv db repeat (null dx)", m.get(db2), db1);
    check_bits("fp16 conv dx untouched when null", m.get(dx2), Mem::poison<float>(nx));
  }
}

OP_CASE("every linear shape; dx and db null; no input features gives the bias", linear_forward_f16,
        linear_backward_f16) {
  uint32_t seed = 100;
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
    b.ops->linear_forward_f16(s, x, w, m.in(bh), y);
    b.ops->linear_backward_f16(s, x, w, dy, dx, dw, db);
    std::vector<float> y16_ref(dyh.size()), dx16_ref(xh.size()), dw16_ref(wh.size()), db16_ref(bh.size());
    ref::linear_forward_f16(s, xh.data(), wh.data(), bh.data(), y16_ref.data());
    ref::linear_backward_f16(s, xh.data(), wh.data(), dyh.data(), dx16_ref.data(), dw16_ref.data(),
                             db16_ref.data());
    check_f16_ref("fp16 linear forward against the fp16 reference", m.get(y), y16_ref, ResultRounding::Fp32);
    check_f16_ref("fp16 linear dx against the fp16 reference", m.get(dx), dx16_ref, ResultRounding::Fp32);
    check_f16_ref("fp16 linear dw against the fp16 reference", m.get(dw), dw16_ref, ResultRounding::Fp32);
    check_f16("fp16 linear forward", m.get(y), y_ref, s.in, mx, mw, mb);
    check_f16("fp16 linear dx", m.get(dx), dx_ref, s.out, mw, mdy, 0.0);
    const auto dw1 = m.get(dw);
    check_f16("fp16 linear dw", dw1, dw_ref, s.n, mx, mdy, 0.0);
    check_gemm_like("fp16 linear db", m.get(db), db_ref);
    float *dx2 = m.out<float>(xh.size()), *dw2 = m.out<float>(wh.size());
    b.ops->linear_backward_f16(s, x, w, dy, nullptr, dw2, nullptr);
    check_bits("fp16 linear dw repeat (null dx)", m.get(dw2), dw1);
    check_bits("fp16 linear dx untouched when null", m.get(dx2), Mem::poison<float>(xh.size()));
  }
  const LinearShape s{3, 0, 4};
  const std::vector<float> bh = {1.0f, -2.0f, 0.5f, 3.0f};
  Mem m(b);
  float *y = m.out<float>(12), *db = m.out<float>(4);
  b.ops->linear_forward_f16(s, nullptr, nullptr, m.in(bh), y);
  std::vector<float> want;
  for (int i = 0; i < s.n; ++i) want.insert(want.end(), bh.begin(), bh.end());
  check_bits("linear in=0 forward", m.get(y), want);
  b.ops->linear_backward_f16(s, nullptr, nullptr, m.in(std::vector<float>(12, 1.0f)), nullptr, nullptr, db);
  check_bits("linear in=0 db", m.get(db), std::vector<float>(4, 3.0f));
}

// Each chunk computed by the whole-batch fp16 op: the chunked fp16 ops against the fp32
// reference chunked ops with the fp16 bound; the bias tree (fp32 dy, double) as in fp32.
OP_CASE("against the ref chunked ops, every chunk shape", conv2d_forward_chunks_f16, conv2d_backward_chunks_f16,
        linear_forward_chunks_f16, linear_backward_chunks_f16) {
  std::mt19937 g(17);
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    if (!kConvShapes[t].chunks) continue;
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    const ChunkedLayerCase c = chunked_case(s, g, 0.5f);
    const std::vector<int>& bd = c.bounds;
    const auto &x = c.x, &w = c.w, &bias = c.bias, &dy = c.dy;
    const std::size_t xn = x.size(), yn = dy.size(), wn = w.size();
    const auto &y_ref = c.y_ref, &dx_ref = c.dx_ref, &dw_ref = c.dw_ref;
    const auto& db_ref = c.db_ref;
    Mem m(b);
    float *y = m.out<float>(yn), *dx = m.out<float>(xn), *dw = m.out<float>(wn);
    double* db = m.out<double>(s.k);
    const float *xd = m.in(x), *wd = m.in(w);
    b.ops->conv2d_forward_chunks_f16(s, kTreeChunks, bd.data(), xd, wd, m.in(bias), y);
    b.ops->conv2d_backward_chunks_f16(s, kTreeChunks, bd.data(), xd, wd, m.in(dy), dx, dw, db);
    const double mx = magnitude(x), mw = magnitude(w), mdy = magnitude(dy);
    check_f16("fp16 chunks conv y", m.get(y), y_ref, static_cast<int64_t>(s.c) * s.r * s.s, mx, mw, magnitude(bias));
    check_f16("fp16 chunks conv dx", m.get(dx), dx_ref, static_cast<int64_t>(s.k) * s.r * s.s, mw, mdy, 0.0);
    check_f16("fp16 chunks conv dw", m.get(dw), dw_ref, static_cast<int64_t>(s.n) * s.out_h() * s.out_w(), mx, mdy, 0.0);
    const double scale = 2.0 * 0x1p-24 * sum_abs(dy);
    check_close("fp16 chunks conv db", m.get(db), db_ref, [&](std::size_t) { return scale; });
  }
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    if (!kLinearShapes[t].chunks) continue;
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    const ChunkedLayerCase c = chunked_case(s, g, 0.1f);
    const std::vector<int>& bd = c.bounds;
    const auto &x = c.x, &w = c.w, &bias = c.bias, &dy = c.dy;
    const auto &y_ref = c.y_ref, &dx_ref = c.dx_ref, &dw_ref = c.dw_ref;
    const auto& db_ref = c.db_ref;
    Mem m(b);
    float *y = m.out<float>(dy.size()), *dx = m.out<float>(x.size()), *dw = m.out<float>(w.size());
    double* db = m.out<double>(s.out);
    const float *xd = m.in(x), *wd = m.in(w);
    b.ops->linear_forward_chunks_f16(s, kTreeChunks, bd.data(), xd, wd, m.in(bias), y);
    b.ops->linear_backward_chunks_f16(s, kTreeChunks, bd.data(), xd, wd, m.in(dy), dx, dw, db);
    const double mx = magnitude(x), mw = magnitude(w), mdy = magnitude(dy);
    check_f16("fp16 chunks linear y", m.get(y), y_ref, s.in, mx, mw, magnitude(bias));
    check_f16("fp16 chunks linear dx", m.get(dx), dx_ref, s.out, mw, mdy, 0.0);
    check_f16("fp16 chunks linear dw", m.get(dw), dw_ref, s.n, mx, mdy, 0.0);
    const double scale = 2.0 * 0x1p-24 * sum_abs(dy);
    check_close("fp16 chunks linear db", m.get(db), db_ref, [&](std::size_t) { return scale; });
  }
}
