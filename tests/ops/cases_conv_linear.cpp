// Cases of conv2d_forward/backward and linear_forward/backward (whole batch, fp32), and
// the hand-computed definitions of the reference.
#include "gpu/reduction_bounds.h"
#include "ops/harness.h"

using namespace ops_test;
namespace rb = reduction_bounds;

TEST_CASE("ref conv2d is a zero-padded cross-correlation in NCHW/OIHW layout") {
  // 1 image, 1 channel, 2x3 input, 2x2 kernel, pad 1 -> 3x4 output.
  const ConvShape s{1, 1, 2, 3, 2, 2, 2, 1};
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> w = {1, 10, 100, 1000, /* second output channel */ 0, 0, 0, 1};
  const std::vector<float> b = {0.5f, -1.0f};
  std::vector<float> y(2 * 3 * 4);
  ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), y.data());
  const std::vector<float> want = {
      1000.5f, 2100.5f, 3200.5f, 300.5f,  // oh = 0: only the kernel's bottom row reads x
      4010.5f, 5421.5f, 6532.5f, 603.5f,  // oh = 1
      40.5f,   54.5f,   65.5f,   6.5f,    // oh = 2: only the top row
      0.0f,    1.0f,    2.0f,    -1.0f,   // channel 1 reads x[oh, ow] (w[1,1,1] = 1)
      3.0f,    4.0f,    5.0f,    -1.0f,  -1.0f, -1.0f, -1.0f, -1.0f};
  check_bits("hand-computed conv", y, want);
}

TEST_CASE("ref linear uses [out, in] weights") {
  const LinearShape s{2, 3, 2};
  const std::vector<float> x = {1, 2, 3, -1, 0, 1};
  const std::vector<float> w = {1, 10, 100, 0, 1, 0};
  const std::vector<float> bias = {0.5f, 2.0f};
  std::vector<float> y(4);
  ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), bias.data(), y.data());
  check_bits("hand-computed linear", y, std::vector<float>{321.5f, 4.0f, 99.5f, 2.0f});
}

OP_CASE("every conv shape, with and without bias", conv2d_forward) {
  std::mt19937 g(101);
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.c * s.r * s.s));
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.c * s.h * s.w, g, -1.0f, 1.0f);
    const auto w = uniform(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, g, -bound, bound);
    const auto bias = uniform(static_cast<std::size_t>(s.k), g, -bound, bound);
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const double terms = s.c * s.r * s.s + 1;
    Mem m(b);
    float *dx = m.in(x), *dw = m.in(w), *db = m.in(bias);
    for (const bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      std::vector<float> y_ref(ny), y_sq(ny);
      ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), with_bias ? bias.data() : nullptr, y_ref.data());
      float* y = m.out<float>(ny);
      b.ops->conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, dx, dw, with_bias ? db : nullptr, y);
      const auto got = m.get(y);
      if (b.cuda) {
        check_gemm_like("conv y", got, y_ref);
      } else {
        const auto b2 = squared(bias);
        ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, squared(x).data(), squared(w).data(), with_bias ? b2.data() : nullptr, y_sq.data());
        check_close("conv y", got, y_ref, [&](std::size_t i) { return gemm_tol(y_ref[i], y_sq[i], terms); });
      }
    }
  }
}

OP_CASE("every conv shape: dx, dw, db; dx null (dx untouched) and db null", conv2d_backward) {
  std::mt19937 g(102);
  for (std::size_t t = 0; t < kConvShapeCount; ++t) {
    const ConvShape s = kConvShapes[t].s;
    CAPTURE(conv_name(s));
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.c * s.r * s.s));
    const int ohw = s.out_h() * s.out_w();
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    const std::size_t nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s;
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.k * ohw;
    const auto x = uniform(nx, g, -1.0f, 1.0f);
    const auto w = uniform(nw, g, -bound, bound);
    const auto dy = uniform(ny, g, -1.0f, 1.0f);

    std::vector<float> dx_ref(nx), dw_ref(nw), db_ref(s.k);
    ref::conv2d_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    std::vector<float> dx_sq(nx), dw_sq(nw), db_sq(s.k);
    std::vector<double> dy_abs(s.k, 0.0);
    if (b.is_cpu()) {
      ref::conv2d_backward(s, engine::Precision::Fp32, squared(x).data(), squared(w).data(), squared(dy).data(), dx_sq.data(), dw_sq.data(),
                           db_sq.data());
      for (int n = 0; n < s.n; ++n)
        for (int k = 0; k < s.k; ++k)
          for (int i = 0; i < ohw; ++i) dy_abs[k] += std::fabs(dy[(static_cast<std::size_t>(n) * s.k + k) * ohw + i]);
    }
    auto check_dx = [&](const std::string& what, const std::vector<float>& got) {
      if (b.cuda) return check_gemm_like(what, got, dx_ref);
      check_close(what, got, dx_ref, [&](std::size_t i) { return gemm_tol(dx_ref[i], dx_sq[i], s.k * s.r * s.s); });
    };
    auto check_dw = [&](const std::string& what, const std::vector<float>& got) {
      if (b.cuda) return check_gemm_like(what, got, dw_ref);
      check_close(what, got, dw_ref, [&](std::size_t i) {
        return gemm_tol(dw_ref[i], dw_sq[i], static_cast<double>(s.n) * ohw + kTreeChunks);
      });
    };
    auto check_db = [&](const std::string& what, const std::vector<float>& got) {
      if (b.cuda) return check_gemm_like(what, got, db_ref);
      check_close(what, got, db_ref,
                  [&](std::size_t i) { return sum_tol(db_ref[i], dy_abs[i], static_cast<double>(s.n) * ohw); });
    };

    // Outputs poisoned: backward ops overwrite, never accumulate.
    Mem m(b);
    const float *xd = m.in(x), *wd = m.in(w), *dyd = m.in(dy);
    float *dx = m.out<float>(nx), *dw = m.out<float>(nw), *db = m.out<float>(s.k);
    b.ops->conv2d_backward(s, engine::Precision::Fp32, xd, wd, dyd, dx, dw, db);
    const auto dx1 = m.get(dx), dw1 = m.get(dw), db1 = m.get(db);
    check_dx("conv dx", dx1);
    check_dw("conv dw", dw1);
    check_db("conv db", db1);

    // dx null (the first layer): dw and db as before (bit for bit on the cpu), an
    // unpassed dx untouched.
    float *dx2 = m.out<float>(nx), *dw2 = m.out<float>(nw), *db2 = m.out<float>(s.k);
    b.ops->conv2d_backward(s, engine::Precision::Fp32, xd, wd, dyd, nullptr, dw2, db2);
    check_bits("conv dx untouched when null", m.get(dx2), Mem::poison<float>(nx));
    // db null as well (the reference defines it).
    float *dx3 = m.out<float>(nx), *dw3 = m.out<float>(nw);
    b.ops->conv2d_backward(s, engine::Precision::Fp32, xd, wd, dyd, dx3, dw3, nullptr);
    if (b.cuda) {
      check_dw("conv dw with dx null", m.get(dw2));
      check_db("conv db with dx null", m.get(db2));
      check_dx("conv dx with db null", m.get(dx3));
      check_dw("conv dw with db null", m.get(dw3));
    } else {
      check_bits("conv dw with dx null", m.get(dw2), dw1);
      check_bits("conv db with dx null", m.get(db2), db1);
      check_bits("conv dw with db null", m.get(dw3), dw1);
      check_bits("conv dx with db null", m.get(dx3), dx1);
    }
    std::vector<float> dw_ref2(nw, kNaN);
    ref::conv2d_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), nullptr, dw_ref2.data(), nullptr);
    check_bits("ref conv dw with dx, db null", dw_ref2, dw_ref);
  }
}

// The GPU's channel sums over ragged slices (reduction_bounds.h): conv2d_backward with
// only db, dy [n, 64, 14, 14] at n = 128 and 88 (25 or 17 slices).
CUDA_CASE("bias gradient on ragged slices (n = 128, 88) within the derived bound", conv2d_backward) {
  std::mt19937 rng(270);
  for (int n : {128, 88}) {
    ConvShape s{n, 32, 14, 14, 64, 3, 3, 1};
    const int64_t hw = static_cast<int64_t>(s.out_h()) * s.out_w();
    const auto dyh = uniform(static_cast<std::size_t>(n) * s.k * hw, rng);
    const std::vector<float> x0(static_cast<std::size_t>(n) * s.c * s.h * s.w, 0.0f);
    const std::vector<float> w0(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, 0.0f);
    std::vector<float> dx_ref(x0.size()), dw_ref(w0.size()), db_ref(static_cast<std::size_t>(s.k));
    ref::conv2d_backward(s, engine::Precision::Fp32, x0.data(), w0.data(), dyh.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    Mem m(b);
    float* db = m.out<float>(static_cast<std::size_t>(s.k));
    b.ops->conv2d_backward(s, engine::Precision::Fp32, m.in(x0), m.in(w0), m.in(dyh), nullptr, nullptr, db);
    const auto bound = rb::channel_sum_tolerances(n, s.k, hw, dyh.data(), db_ref);
    check_close("conv db n=" + std::to_string(n), m.get(db), db_ref, [&](std::size_t i) { return bound[i]; }, true);
  }
}

OP_CASE("every linear shape, with and without bias", linear_forward) {
  std::mt19937 g(201);
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.in));
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.in, g, -1.0f, 1.0f);
    const auto w = uniform(static_cast<std::size_t>(s.out) * s.in, g, -bound, bound);
    const auto bias = uniform(static_cast<std::size_t>(s.out), g, -bound, bound);
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.out;
    Mem m(b);
    const float *xd = m.in(x), *wd = m.in(w), *bd = m.in(bias);
    for (const bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      std::vector<float> y_ref(ny), y_sq(ny);
      ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), with_bias ? bias.data() : nullptr, y_ref.data());
      float* y = m.out<float>(ny);
      b.ops->linear_forward(s, engine::Precision::Fp32, BatchSplit{}, xd, wd, with_bias ? bd : nullptr, y);
      if (b.cuda) {
        check_gemm_like("linear y", m.get(y), y_ref);
      } else {
        const auto b2 = squared(bias);
        ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, squared(x).data(), squared(w).data(), with_bias ? b2.data() : nullptr, y_sq.data());
        check_close("linear y", m.get(y), y_ref, [&](std::size_t i) { return gemm_tol(y_ref[i], y_sq[i], s.in + 1); });
      }
    }
  }
}

OP_CASE("every linear shape: dx, dw, db; dx null and db null", linear_backward) {
  std::mt19937 g(202);
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.in));
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.in;
    const std::size_t nw = static_cast<std::size_t>(s.out) * s.in;
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.out;
    const auto x = uniform(nx, g, -1.0f, 1.0f);
    const auto w = uniform(nw, g, -bound, bound);
    const auto dy = uniform(ny, g, -1.0f, 1.0f);
    std::vector<float> dx_ref(nx), dw_ref(nw), db_ref(s.out);
    ref::linear_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    std::vector<float> dx_sq(nx), dw_sq(nw), db_sq(s.out);
    std::vector<double> dy_abs(s.out, 0.0);
    if (b.is_cpu()) {
      ref::linear_backward(s, engine::Precision::Fp32, squared(x).data(), squared(w).data(), squared(dy).data(), dx_sq.data(), dw_sq.data(),
                           db_sq.data());
      for (int n = 0; n < s.n; ++n)
        for (int o = 0; o < s.out; ++o) dy_abs[o] += std::fabs(dy[static_cast<std::size_t>(n) * s.out + o]);
    }
    Mem m(b);
    const float *xd = m.in(x), *wd = m.in(w), *dyd = m.in(dy);
    float *dx = m.out<float>(nx), *dw = m.out<float>(nw), *db = m.out<float>(s.out);
    b.ops->linear_backward(s, engine::Precision::Fp32, xd, wd, dyd, dx, dw, db);
    const auto dx1 = m.get(dx), dw1 = m.get(dw), db1 = m.get(db);
    if (b.cuda) {
      check_gemm_like("linear dx", dx1, dx_ref);
      check_gemm_like("linear dw", dw1, dw_ref);
      check_gemm_like("linear db", db1, db_ref);
    } else {
      check_close("linear dx", dx1, dx_ref, [&](std::size_t i) { return gemm_tol(dx_ref[i], dx_sq[i], s.out); });
      check_close("linear dw", dw1, dw_ref,
                  [&](std::size_t i) { return gemm_tol(dw_ref[i], dw_sq[i], s.n + kTreeChunks); });
      check_close("linear db", db1, db_ref, [&](std::size_t i) { return sum_tol(db_ref[i], dy_abs[i], s.n); });
    }
    float *dw2 = m.out<float>(nw), *db2 = m.out<float>(s.out);
    b.ops->linear_backward(s, engine::Precision::Fp32, xd, wd, dyd, nullptr, dw2, db2);
    float *dx3 = m.out<float>(nx), *dw3 = m.out<float>(nw);
    b.ops->linear_backward(s, engine::Precision::Fp32, xd, wd, dyd, dx3, dw3, nullptr);
    if (b.cuda) {
      check_gemm_like("linear dw with dx null", m.get(dw2), dw_ref);
      check_gemm_like("linear db with dx null", m.get(db2), db_ref);
      check_gemm_like("linear dx with db null", m.get(dx3), dx_ref);
      check_gemm_like("linear dw with db null", m.get(dw3), dw_ref);
    } else {
      check_bits("linear dw with dx null", m.get(dw2), dw1);
      check_bits("linear db with dx null", m.get(db2), db1);
      check_bits("linear dx with db null", m.get(dx3), dx1);
      check_bits("linear dw with db null", m.get(dw3), dw1);
    }
    std::vector<float> dw_ref2(nw, kNaN);
    ref::linear_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), nullptr, dw_ref2.data(), nullptr);
    check_bits("ref linear dw with dx, db null", dw_ref2, dw_ref);
  }
}
