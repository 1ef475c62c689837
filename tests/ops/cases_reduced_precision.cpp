// Conv and linear in fp16 and bf16 (mixed precision; ref and cuda run them, the cpu
// does not: OP_CASE_IN), as one set of cases run once per precision:
//  * against the fp32 reference with the format's product bound (tests/ops/harness.h:
//    check_f16, check_bf16); bias gradients stay fp32 (1e-4 of magnitude);
//  * against the format's own reference (kernels/ref/mixed_precision.cpp), which rounds
//    the operands as the CUDA ops do: then only the library's summation order separates
//    them (1e-4 of the magnitude, as the fp32 cuDNN and cuBLAS ops), plus, where the
//    result itself is rounded to the format (conv), one step of it (fp16 2^-10, bf16 2^-7
//    relative);
//  * the chunked forms against the fp32 reference chunked ops with the product bound; the
//    bias tree (fp32 dy, double) as in fp32.
// The CPU checks of the references themselves are in cases_bf16.cpp and
// tests/test_fp16_rounding.cpp.
#include "ops/harness.h"

using namespace ops_test;

namespace {

using BoundCheck = void (*)(const std::string&, const std::vector<float>&, const std::vector<float>&, int64_t, double,
                            double, double);

// One 16-bit precision: its name, the step of a result rounded to it, its product bound.
struct Format {
  const char* name;
  Precision precision;
  double result_step;
  BoundCheck bound;
};

const Format kFp16{"fp16", Precision::Fp16, 0x1p-10, check_f16};
const Format kBf16{"bf16", Precision::Bf16, 0x1p-7, check_bf16};

// Against the format's reference: the library's order (1e-4 of the magnitude), plus one
// step of the format where the result itself is rounded to it.
void check_own_ref(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                   double step) {
  check_rel(what, got, want, step, 1e-4 * std::max(1.0, magnitude(want)));
}

void conv_cases(const Backend& b, const Format& f, uint32_t seed) {
  const std::string n = f.name;
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    std::mt19937 rng(seed++);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w, nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s,
                      ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const auto xh = uniform(nx, rng), wh = uniform(nw, rng, -0.5f, 0.5f), bh = uniform(s.k, rng), dyh = uniform(ny, rng);
    std::vector<float> y_ref(ny), y_nb(ny), dx_ref(nx), dw_ref(nw), db_ref(s.k);
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, xh.data(), wh.data(), nullptr, y_nb.data());
    ref::conv2d_backward(s, engine::Precision::Fp32, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);
    const int64_t k_fwd = static_cast<int64_t>(s.c) * s.r * s.s, k_dx = static_cast<int64_t>(s.k) * s.r * s.s,
                  k_dw = static_cast<int64_t>(s.n) * s.out_h() * s.out_w();
    Mem m(b);
    const float *x = m.in(xh), *w = m.in(wh), *dy = m.in(dyh);
    float *y = m.out<float>(ny), *y2 = m.out<float>(ny), *dx = m.out<float>(nx), *dw = m.out<float>(nw),
          *db = m.out<float>(s.k);
    std::vector<float> y16_ref(ny), dx16_ref(nx), dw16_ref(nw), db16_ref(s.k);
    ref::conv2d_forward(s, f.precision, BatchSplit{}, xh.data(), wh.data(), bh.data(), y16_ref.data());
    ref::conv2d_backward(s, f.precision, xh.data(), wh.data(), dyh.data(), dx16_ref.data(), dw16_ref.data(), db16_ref.data());
    b.ops->conv2d_forward(s, f.precision, BatchSplit{}, x, w, m.in(bh), y);
    f.bound(n + " conv forward", m.get(y), y_ref, k_fwd, mx, mw, mb);
    check_own_ref(n + " conv forward against the " + n + " reference", m.get(y), y16_ref, f.result_step);
    b.ops->conv2d_forward(s, f.precision, BatchSplit{}, x, w, nullptr, y2);
    f.bound(n + " conv forward (no bias)", m.get(y2), y_nb, k_fwd, mx, mw, 0.0);
    b.ops->conv2d_backward(s, f.precision, x, w, dy, dx, dw, db);
    f.bound(n + " conv dx", m.get(dx), dx_ref, k_dx, mw, mdy, 0.0);
    const auto dw1 = m.get(dw), db1 = m.get(db);
    f.bound(n + " conv dw", dw1, dw_ref, k_dw, mx, mdy, 0.0);
    check_own_ref(n + " conv dx against the " + n + " reference", m.get(dx), dx16_ref, f.result_step);
    check_own_ref(n + " conv dw against the " + n + " reference", dw1, dw16_ref, f.result_step);
    check_gemm_like(n + " conv db against the " + n + " reference", db1, db16_ref);
    check_gemm_like(n + " conv db", db1, db_ref);
    float *dx2 = m.out<float>(nx), *dw2 = m.out<float>(nw), *db2 = m.out<float>(s.k);
    b.ops->conv2d_backward(s, f.precision, x, w, dy, nullptr, dw2, db2);
    check_bits(n + " conv dw repeat (null dx)", m.get(dw2), dw1);
    check_bits(n + " conv db repeat (null dx)", m.get(db2), db1);
    check_bits(n + " conv dx untouched when null", m.get(dx2), Mem::poison<float>(nx));
  }
}

void linear_cases(const Backend& b, const Format& f, uint32_t seed) {
  const std::string n = f.name;
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    std::mt19937 rng(seed++);
    const auto xh = uniform(static_cast<std::size_t>(s.n) * s.in, rng), wh = uniform(static_cast<std::size_t>(s.out) * s.in, rng, -0.1f, 0.1f),
               bh = uniform(s.out, rng), dyh = uniform(static_cast<std::size_t>(s.n) * s.out, rng);
    std::vector<float> y_ref(dyh.size()), dx_ref(xh.size()), dw_ref(wh.size()), db_ref(bh.size());
    ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, xh.data(), wh.data(), bh.data(), y_ref.data());
    ref::linear_backward(s, engine::Precision::Fp32, xh.data(), wh.data(), dyh.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    const double mx = magnitude(xh), mw = magnitude(wh), mb = magnitude(bh), mdy = magnitude(dyh);
    Mem m(b);
    const float *x = m.in(xh), *w = m.in(wh), *dy = m.in(dyh);
    float *y = m.out<float>(dyh.size()), *dx = m.out<float>(xh.size()), *dw = m.out<float>(wh.size()),
          *db = m.out<float>(bh.size());
    b.ops->linear_forward(s, f.precision, BatchSplit{}, x, w, m.in(bh), y);
    b.ops->linear_backward(s, f.precision, x, w, dy, dx, dw, db);
    std::vector<float> y16_ref(dyh.size()), dx16_ref(xh.size()), dw16_ref(wh.size()), db16_ref(bh.size());
    ref::linear_forward(s, f.precision, BatchSplit{}, xh.data(), wh.data(), bh.data(), y16_ref.data());
    ref::linear_backward(s, f.precision, xh.data(), wh.data(), dyh.data(), dx16_ref.data(), dw16_ref.data(), db16_ref.data());
    // Linear results are fp32 (cuBLAS writes them so): no step of the format.
    check_own_ref(n + " linear forward against the " + n + " reference", m.get(y), y16_ref, 0.0);
    check_own_ref(n + " linear dx against the " + n + " reference", m.get(dx), dx16_ref, 0.0);
    check_own_ref(n + " linear dw against the " + n + " reference", m.get(dw), dw16_ref, 0.0);
    f.bound(n + " linear forward", m.get(y), y_ref, s.in, mx, mw, mb);
    f.bound(n + " linear dx", m.get(dx), dx_ref, s.out, mw, mdy, 0.0);
    const auto dw1 = m.get(dw);
    f.bound(n + " linear dw", dw1, dw_ref, s.n, mx, mdy, 0.0);
    check_gemm_like(n + " linear db", m.get(db), db_ref);
    float *dx2 = m.out<float>(xh.size()), *dw2 = m.out<float>(wh.size());
    b.ops->linear_backward(s, f.precision, x, w, dy, nullptr, dw2, nullptr);
    check_bits(n + " linear dw repeat (null dx)", m.get(dw2), dw1);
    check_bits(n + " linear dx untouched when null", m.get(dx2), Mem::poison<float>(xh.size()));
  }
  const LinearShape s{3, 0, 4};
  const std::vector<float> bh = {1.0f, -2.0f, 0.5f, 3.0f};
  Mem m(b);
  float *y = m.out<float>(12), *db = m.out<float>(4);
  b.ops->linear_forward(s, f.precision, BatchSplit{}, nullptr, nullptr, m.in(bh), y);
  std::vector<float> want;
  for (int i = 0; i < s.n; ++i) want.insert(want.end(), bh.begin(), bh.end());
  check_bits(n + " linear in=0 forward", m.get(y), want);
  b.ops->linear_backward(s, f.precision, nullptr, nullptr, m.in(std::vector<float>(12, 1.0f)), nullptr, nullptr, db);
  check_bits(n + " linear in=0 db", m.get(db), std::vector<float>(4, 3.0f));
}

// Each chunk computed by the whole-batch 16-bit op.
void chunk_cases(const Backend& b, const Format& f, uint32_t seed) {
  const std::string n = f.name;
  std::mt19937 g(seed);
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    if (!kConvShapes[t].chunks) continue;
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    const ChunkedLayerCase c = chunked_case(s, g, 0.5f);
    Mem m(b);
    float *y = m.out<float>(c.dy.size()), *dx = m.out<float>(c.x.size()), *dw = m.out<float>(c.w.size());
    double* db = m.out<double>(s.k);
    const float *xd = m.in(c.x), *wd = m.in(c.w);
    b.ops->conv2d_forward(s, f.precision, BatchSplit{kTreeChunks, c.bounds.data()}, xd, wd, m.in(c.bias), y);
    b.ops->conv2d_backward_chunks(s, f.precision, kTreeChunks, c.bounds.data(), xd, wd, m.in(c.dy), dx, dw, db);
    const double mx = magnitude(c.x), mw = magnitude(c.w), mdy = magnitude(c.dy);
    f.bound(n + " chunks conv y", m.get(y), c.y_ref, static_cast<int64_t>(s.c) * s.r * s.s, mx, mw, magnitude(c.bias));
    f.bound(n + " chunks conv dx", m.get(dx), c.dx_ref, static_cast<int64_t>(s.k) * s.r * s.s, mw, mdy, 0.0);
    f.bound(n + " chunks conv dw", m.get(dw), c.dw_ref, static_cast<int64_t>(s.n) * s.out_h() * s.out_w(), mx, mdy,
            0.0);
    const double scale = 2.0 * 0x1p-24 * sum_abs(c.dy);
    check_close(n + " chunks conv db", m.get(db), c.db_ref, [&](std::size_t) { return scale; });
  }
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    if (!kLinearShapes[t].chunks) continue;
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    const ChunkedLayerCase c = chunked_case(s, g, 0.1f);
    Mem m(b);
    float *y = m.out<float>(c.dy.size()), *dx = m.out<float>(c.x.size()), *dw = m.out<float>(c.w.size());
    double* db = m.out<double>(s.out);
    const float *xd = m.in(c.x), *wd = m.in(c.w);
    b.ops->linear_forward(s, f.precision, BatchSplit{kTreeChunks, c.bounds.data()}, xd, wd, m.in(c.bias), y);
    b.ops->linear_backward_chunks(s, f.precision, kTreeChunks, c.bounds.data(), xd, wd, m.in(c.dy), dx, dw, db);
    const double mx = magnitude(c.x), mw = magnitude(c.w), mdy = magnitude(c.dy);
    f.bound(n + " chunks linear y", m.get(y), c.y_ref, s.in, mx, mw, magnitude(c.bias));
    f.bound(n + " chunks linear dx", m.get(dx), c.dx_ref, s.out, mw, mdy, 0.0);
    f.bound(n + " chunks linear dw", m.get(dw), c.dw_ref, s.n, mx, mdy, 0.0);
    const double scale = 2.0 * 0x1p-24 * sum_abs(c.dy);
    check_close(n + " chunks linear db", m.get(db), c.db_ref, [&](std::size_t) { return scale; });
  }
}

}  // namespace

OP_CASE_IN(Precision::Fp16, "fp16: every conv shape, with and without bias; dx null (dx untouched)", conv2d_forward,
           conv2d_backward) {
  conv_cases(b, kFp16, 11);
}
OP_CASE_IN(Precision::Bf16, "bf16: every conv shape, with and without bias; dx null (dx untouched)", conv2d_forward,
           conv2d_backward) {
  conv_cases(b, kBf16, 511);
}
OP_CASE_IN(Precision::Fp16, "fp16: every linear shape; dx and db null; no input features gives the bias",
           linear_forward, linear_backward) {
  linear_cases(b, kFp16, 100);
}
OP_CASE_IN(Precision::Bf16, "bf16: every linear shape; dx and db null; no input features gives the bias",
           linear_forward, linear_backward) {
  linear_cases(b, kBf16, 611);
}
OP_CASE_IN(Precision::Fp16, "fp16: against the ref chunked ops, every chunk shape", conv2d_forward,
           conv2d_backward_chunks, linear_forward, linear_backward_chunks) {
  chunk_cases(b, kFp16, 17);
}
OP_CASE_IN(Precision::Bf16, "bf16: against the ref chunked ops, every chunk shape", conv2d_forward,
           conv2d_backward_chunks, linear_forward, linear_backward_chunks) {
  chunk_cases(b, kBf16, 19);
}
