// The chunked ops (Chunks in kernels/op_list.inc) on the cpu: against the reference with
// the tolerances of tests/ops/harness.h (T = terms + chunks: the tree adds one rounding
// per level), the reference chunked ops against the unchunked reference, backward passes
// against finite differences (tests/gradcheck.h), and the property data parallelism
// rests on: an op run on one rank's chunks, its subtree sums then summed over the ranks
// by the fixed tree, gives the bits of the op run on the whole batch, for W = 2, 4, 8.
// Every backend's chunked ops against ref:: are in cases_chunks_backends.cpp.
#include <omp.h>

#include <functional>
#include <iterator>

#include "kernels/batchnorm_math.h"
#include "ops/harness.h"

using namespace ops_test;
namespace cpu = engine::kernels::cpu;
using engine::kernels::tree_chunk_begin;
using engine::kernels::BatchSplit;

namespace {
std::vector<ConvShape> chunk_conv_shapes() {
  std::vector<ConvShape> v;
  for (std::size_t i = 0; i < kConvShapeCount; ++i)
    if (kConvShapes[i].chunks) v.push_back(kConvShapes[i].s);
  return v;
}
std::vector<LinearShape> chunk_linear_shapes() {
  std::vector<LinearShape> v;
  for (std::size_t i = 0; i < kLinearShapeCount; ++i)
    if (kLinearShapes[i].chunks) v.push_back(kLinearShapes[i].s);
  return v;
}
const BatchNormShape kBn[] = {{13, 3, 30}, {5, 4, 7}, {24, 8, 49}, {16, 2, 1}};
}  // namespace

TEST_CASE("tree_sum and tree_sum_in_place are ((c0+c1)+(c2+c3))+((c4+c5)+(c6+c7))") {
  const float v[8] = {1e8f, 1.0f, -1e8f, 3.0f, 0.5f, 1e-3f, 7e7f, -7e7f};
  const float want = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  CHECK(engine::kernels::tree_sum(v, 8) == want);
  std::vector<float> p(v, v + 8);
  engine::kernels::tree_sum_in_place(p.data(), 8, 1, 1);
  CHECK(p[0] == want);
  CHECK(engine::kernels::tree_sum(v, 2) == v[0] + v[1]);
  CHECK(engine::kernels::tree_sum(v, 1) == v[0]);
}

CPU_CASE("cpu matches ref; ref matches the unchunked ref; ranks' subtrees give the whole batch's bits", conv2d_forward, conv2d_backward_chunks) {
  std::mt19937 g(11);
  for (const ConvShape& s : chunk_conv_shapes()) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    const int ohw = s.out_h() * s.out_w();
    const std::size_t in = static_cast<std::size_t>(s.c) * s.h * s.w, out = static_cast<std::size_t>(s.k) * ohw;
    const std::size_t nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s;
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.c * s.r * s.s));
    const auto x = uniform(in * s.n, g, -1, 1), w = uniform(nw, g, -bound, bound), b = uniform(s.k, g, -1, 1);
    const auto dy = uniform(out * s.n, g, -1, 1);
    const Share all = whole(s.n);

    std::vector<float> y(out * s.n), y_ref(out * s.n);
    cpu::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{all.chunks, all.bounds.data()}, x.data(), w.data(), b.data(), y.data());
    ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), y_ref.data());
    std::vector<float> y_plain(out * s.n);
    cpu::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), y_plain.data());
    check_bits("conv forward chunks = conv2d_forward", y, y_plain);

    std::vector<float> dx(in * s.n), dw(nw);
    std::vector<double> db(s.k);
    cpu::conv2d_backward_chunks(s, engine::Precision::Fp32, all.chunks, all.bounds.data(), x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                                db.data());
    std::vector<float> dx_ref(in * s.n), dw_ref(nw), db_ref(s.k), dx_sq(in * s.n), dw_sq(nw), db_sq(s.k);
    ref::conv2d_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    ref::conv2d_backward(s, engine::Precision::Fp32, squared(x).data(), squared(w).data(), squared(dy).data(), dx_sq.data(), dw_sq.data(),
                         db_sq.data());
    std::vector<double> dy_abs(s.k, 0.0);
    for (int n = 0; n < s.n; ++n)
      for (int k = 0; k < s.k; ++k)
        for (int i = 0; i < ohw; ++i) dy_abs[k] += std::fabs(dy[(static_cast<std::size_t>(n) * s.k + k) * ohw + i]);
    const double terms = static_cast<double>(s.n) * ohw + kTreeChunks;
    check_close("conv dx", dx, dx_ref, [&](std::size_t i) { return gemm_tol(dx_ref[i], dx_sq[i], s.k * s.r * s.s); });
    check_close("conv dw", dw, dw_ref, [&](std::size_t i) { return gemm_tol(dw_ref[i], dw_sq[i], terms); });
    std::vector<double> db_ref_d(db_ref.begin(), db_ref.end());
    check_close("conv db", db, db_ref_d, [&](std::size_t i) { return sum_tol(db_ref[i], dy_abs[i], terms); });

    // The reference chunked op is the reference op, summed by the tree.
    std::vector<float> rdx(in * s.n), rdw(nw);
    std::vector<double> rdb(s.k);
    ref::conv2d_backward_chunks(s, engine::Precision::Fp32, all.chunks, all.bounds.data(), x.data(), w.data(), dy.data(), rdx.data(),
                                rdw.data(), rdb.data());
    check_bits("ref chunked dx = ref dx", rdx, dx_ref);
    check_close("ref chunked dw", rdw, dw_ref, [&](std::size_t i) { return gemm_tol(dw_ref[i], dw_sq[i], terms); });

    for (int world : {2, 4, 8}) {
      CAPTURE(world);
      std::vector<float> dw_parts, y_all(out * s.n), dx_all(in * s.n);
      std::vector<double> db_parts;
      for (int r = 0; r < world; ++r) {
        const Share sh = share(s.n, r, world);
        ConvShape sl = s;
        sl.n = sh.count;
        const auto xl = slice(x, in, sh.first, sh.count), dyl = slice(dy, out, sh.first, sh.count);
        std::vector<float> yl(out * sh.count), dxl(in * sh.count), dwl(nw);
        std::vector<double> dbl(s.k);
        cpu::conv2d_forward(sl, engine::Precision::Fp32, BatchSplit{sh.chunks, sh.bounds.data()}, xl.data(), w.data(), b.data(), yl.data());
        cpu::conv2d_backward_chunks(sl, engine::Precision::Fp32, sh.chunks, sh.bounds.data(), xl.data(), w.data(), dyl.data(), dxl.data(),
                                    dwl.data(), dbl.data());
        std::copy(yl.begin(), yl.end(), y_all.begin() + sh.first * out);
        std::copy(dxl.begin(), dxl.end(), dx_all.begin() + sh.first * in);
        dw_parts.insert(dw_parts.end(), dwl.begin(), dwl.end());
        db_parts.insert(db_parts.end(), dbl.begin(), dbl.end());
      }
      check_bits("conv y by ranks", y_all, y);
      check_bits("conv dx by ranks", dx_all, dx);
      check_bits("conv dw by ranks", top_of_tree(dw_parts, world, nw), dw);
      check_bits("conv db by ranks", top_of_tree(db_parts, world, s.k), db);
    }
  }
}

CPU_CASE("cpu matches ref; ranks' subtrees give the whole batch's bits", linear_forward, linear_backward_chunks) {
  std::mt19937 g(12);
  for (const LinearShape& s : chunk_linear_shapes()) {
    CAPTURE(s.n);
    CAPTURE(s.in);
    const std::size_t nw = static_cast<std::size_t>(s.out) * s.in;
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.in));
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.in, g, -1, 1), w = uniform(nw, g, -bound, bound);
    const auto b = uniform(s.out, g, -1, 1), dy = uniform(static_cast<std::size_t>(s.n) * s.out, g, -1, 1);
    const Share all = whole(s.n);
    std::vector<float> y(static_cast<std::size_t>(s.n) * s.out), y_plain(y.size());
    cpu::linear_forward(s, engine::Precision::Fp32, BatchSplit{all.chunks, all.bounds.data()}, x.data(), w.data(), b.data(), y.data());
    cpu::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), y_plain.data());
    check_bits("linear forward chunks = linear_forward", y, y_plain);

    std::vector<float> dx(x.size()), dw(nw);
    std::vector<double> db(s.out);
    cpu::linear_backward_chunks(s, engine::Precision::Fp32, all.chunks, all.bounds.data(), x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                                db.data());
    std::vector<float> dx_ref(x.size()), dw_ref(nw), db_ref(s.out), dx_sq(x.size()), dw_sq(nw), db_sq(s.out);
    ref::linear_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(), db_ref.data());
    ref::linear_backward(s, engine::Precision::Fp32, squared(x).data(), squared(w).data(), squared(dy).data(), dx_sq.data(), dw_sq.data(),
                         db_sq.data());
    std::vector<double> dy_abs(s.out, 0.0);
    for (int n = 0; n < s.n; ++n)
      for (int o = 0; o < s.out; ++o) dy_abs[o] += std::fabs(dy[static_cast<std::size_t>(n) * s.out + o]);
    const double terms = s.n + kTreeChunks;
    check_close("linear dx", dx, dx_ref, [&](std::size_t i) { return gemm_tol(dx_ref[i], dx_sq[i], s.out); });
    check_close("linear dw", dw, dw_ref, [&](std::size_t i) { return gemm_tol(dw_ref[i], dw_sq[i], terms); });
    std::vector<double> db_ref_d(db_ref.begin(), db_ref.end());
    check_close("linear db", db, db_ref_d, [&](std::size_t i) { return sum_tol(db_ref[i], dy_abs[i], terms); });

    for (int world : {2, 4, 8}) {
      CAPTURE(world);
      std::vector<float> dw_parts, dx_all(x.size()), y_all(y.size());
      std::vector<double> db_parts;
      for (int r = 0; r < world; ++r) {
        const Share sh = share(s.n, r, world);
        LinearShape sl = s;
        sl.n = sh.count;
        const auto xl = slice(x, s.in, sh.first, sh.count), dyl = slice(dy, s.out, sh.first, sh.count);
        std::vector<float> yl(static_cast<std::size_t>(sh.count) * s.out), dxl(xl.size()), dwl(nw);
        std::vector<double> dbl(s.out);
        cpu::linear_forward(sl, engine::Precision::Fp32, BatchSplit{sh.chunks, sh.bounds.data()}, xl.data(), w.data(), b.data(), yl.data());
        cpu::linear_backward_chunks(sl, engine::Precision::Fp32, sh.chunks, sh.bounds.data(), xl.data(), w.data(), dyl.data(), dxl.data(),
                                    dwl.data(), dbl.data());
        std::copy(yl.begin(), yl.end(), y_all.begin() + static_cast<std::size_t>(sh.first) * s.out);
        std::copy(dxl.begin(), dxl.end(), dx_all.begin() + static_cast<std::size_t>(sh.first) * s.in);
        dw_parts.insert(dw_parts.end(), dwl.begin(), dwl.end());
        db_parts.insert(db_parts.end(), dbl.begin(), dbl.end());
      }
      check_bits("linear y by ranks", y_all, y);
      check_bits("linear dx by ranks", dx_all, dx);
      check_bits("linear dw by ranks", top_of_tree(dw_parts, world, nw), dw);
      check_bits("linear db by ranks", top_of_tree(db_parts, world, s.out), db);
    }
  }
}

CPU_CASE("sums, scale/shift and backward: cpu matches ref; in place; ranks give the whole batch's bits", batchnorm_chunk_sums, batchnorm_chunk_centered_squares, batchnorm_scale_shift, batchnorm_backward_chunk_sums, batchnorm_backward_apply) {
  std::mt19937 g(13);
  for (const BatchNormShape& s : kBn) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.hw);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.hw;
    auto x = uniform(nx, g, -1, 1);
    for (float& v : x) v = 2.0f + 3.0f * v;  // a mean away from 0
    const auto dy = uniform(nx, g, -1, 1);
    const Share all = whole(s.n);
    auto channel = [&](std::size_t j) { return (j / s.hw) % s.c; };
    // Exact-enough per-channel sums in long double, and sums of magnitudes.
    std::vector<double> sum(s.c, 0), sum_abs(s.c, 0);
    for (std::size_t j = 0; j < nx; ++j) {
      sum[channel(j)] += x[j];
      sum_abs[channel(j)] += std::fabs(x[j]);
    }
    const double m = static_cast<double>(s.n) * s.hw, terms = m + kTreeChunks;
    std::vector<double> got(s.c), got_ref(s.c);
    cpu::batchnorm_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), got.data());
    ref::batchnorm_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), got_ref.data());
    check_close("bn sum cpu", got, sum, [&](std::size_t c) { return sum_tol(sum[c], sum_abs[c], terms); });
    check_close("bn sum ref", got_ref, sum, [&](std::size_t c) { return 1e-12 * sum_abs[c]; });

    std::vector<float> mean(s.c);
    for (int c = 0; c < s.c; ++c) mean[c] = static_cast<float>(sum[c] / m);
    std::vector<double> sq(s.c, 0), sq_abs(s.c, 0), sdy(s.c, 0), sdy_abs(s.c, 0), sxc(s.c, 0), sxc_abs(s.c, 0);
    for (std::size_t j = 0; j < nx; ++j) {
      const std::size_t c = channel(j);
      const double d = static_cast<double>(x[j]) - mean[c];
      sq[c] += d * d;
      sdy[c] += dy[j];
      sdy_abs[c] += std::fabs(dy[j]);
      sxc[c] += dy[j] * d;
      sxc_abs[c] += std::fabs(dy[j] * d);
    }
    cpu::batchnorm_chunk_centered_squares(s, all.chunks, all.bounds.data(), x.data(), mean.data(), got.data());
    ref::batchnorm_chunk_centered_squares(s, all.chunks, all.bounds.data(), x.data(), mean.data(), got_ref.data());
    // (x - mean) is rounded to float before squaring on the fast path: 2 u relative more.
    check_close("bn sq cpu", got, sq, [&](std::size_t c) { return 4.0 * kU * sq[c] + sum_tol(sq[c], sq[c], terms); });
    check_close("bn sq ref", got_ref, sq, [&](std::size_t c) { return 1e-12 * sq[c]; });

    const auto scale = uniform(s.c, g, 0.5f, 1.5f), shift = uniform(s.c, g, -1, 1);
    std::vector<float> y(nx), y_ref(nx);
    cpu::batchnorm_scale_shift(s, x.data(), scale.data(), shift.data(), y.data());
    ref::batchnorm_scale_shift(s, x.data(), scale.data(), shift.data(), y_ref.data());
    check_close("bn scale_shift", y, y_ref, [&](std::size_t j) {
      return 2.0 * kU * (std::fabs(x[j] * scale[channel(j)]) + std::fabs(shift[channel(j)])) + 1e-30;
    });

    std::vector<double> gdy(s.c), gxc(s.c), rdy(s.c), rxc(s.c);
    cpu::batchnorm_backward_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), dy.data(), mean.data(), gdy.data(),
                                       gxc.data());
    ref::batchnorm_backward_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), dy.data(), mean.data(), rdy.data(),
                                       rxc.data());
    check_close("bn sum dy cpu", gdy, sdy, [&](std::size_t c) { return sum_tol(sdy[c], sdy_abs[c], terms); });
    check_close("bn sum dy*xc cpu", gxc, sxc,
                [&](std::size_t c) { return 4.0 * kU * sxc_abs[c] + sum_tol(sxc[c], sxc_abs[c], terms); });
    check_close("bn sum dy ref", rdy, sdy, [&](std::size_t c) { return 1e-12 * sdy_abs[c]; });
    check_close("bn sum dy*xc ref", rxc, sxc, [&](std::size_t c) { return 1e-12 * sxc_abs[c]; });

    const auto k = uniform(s.c, g, 0.5f, 1.5f), mdy = uniform(s.c, g, -0.1f, 0.1f), proj = uniform(s.c, g, -0.3f, 0.3f);
    std::vector<float> dx(nx), dx_ref(nx);
    cpu::batchnorm_backward_apply(s, x.data(), dy.data(), mean.data(), k.data(), mdy.data(), proj.data(), dx.data());
    ref::batchnorm_backward_apply(s, x.data(), dy.data(), mean.data(), k.data(), mdy.data(), proj.data(),
                                  dx_ref.data());
    check_close("bn backward_apply", dx, dx_ref, [&](std::size_t j) {
      const std::size_t c = channel(j);
      const double xc = std::fabs(static_cast<double>(x[j]) - mean[c]);
      return 8.0 * kU * std::fabs(k[c]) * (std::fabs(dy[j]) + std::fabs(mdy[c]) + xc * std::fabs(proj[c]) + xc) + 1e-30;
    });
    // In place (dx == dy) gives the same bits.
    std::vector<float> inplace(dy);
    cpu::batchnorm_backward_apply(s, x.data(), inplace.data(), mean.data(), k.data(), mdy.data(), proj.data(),
                                  inplace.data());
    check_bits("bn backward_apply in place", inplace, dx);

    const std::size_t per = static_cast<std::size_t>(s.c) * s.hw;
    std::vector<double> want_sum(s.c), want_sq(s.c), want_dy(s.c), want_xc(s.c);
    cpu::batchnorm_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), want_sum.data());
    cpu::batchnorm_chunk_centered_squares(s, all.chunks, all.bounds.data(), x.data(), mean.data(), want_sq.data());
    cpu::batchnorm_backward_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), dy.data(), mean.data(),
                                       want_dy.data(), want_xc.data());
    for (int world : {2, 4, 8}) {
      CAPTURE(world);
      std::vector<double> p_sum, p_sq, p_dy, p_xc;
      for (int r = 0; r < world; ++r) {
        const Share sh = share(s.n, r, world);
        BatchNormShape sl = s;
        sl.n = sh.count;
        const auto xl = slice(x, per, sh.first, sh.count), dyl = slice(dy, per, sh.first, sh.count);
        std::vector<double> a(s.c), b(s.c), c2(s.c), d(s.c);
        cpu::batchnorm_chunk_sums(sl, sh.chunks, sh.bounds.data(), xl.data(), a.data());
        cpu::batchnorm_chunk_centered_squares(sl, sh.chunks, sh.bounds.data(), xl.data(), mean.data(), b.data());
        cpu::batchnorm_backward_chunk_sums(sl, sh.chunks, sh.bounds.data(), xl.data(), dyl.data(), mean.data(),
                                           c2.data(), d.data());
        p_sum.insert(p_sum.end(), a.begin(), a.end());
        p_sq.insert(p_sq.end(), b.begin(), b.end());
        p_dy.insert(p_dy.end(), c2.begin(), c2.end());
        p_xc.insert(p_xc.end(), d.begin(), d.end());
      }
      check_bits("bn sum by ranks", top_of_tree(p_sum, world, s.c), want_sum);
      check_bits("bn sq by ranks", top_of_tree(p_sq, world, s.c), want_sq);
      check_bits("bn sum dy by ranks", top_of_tree(p_dy, world, s.c), want_dy);
      check_bits("bn sum dy*xc by ranks", top_of_tree(p_xc, world, s.c), want_xc);
    }
  }
}

// The cpu batch norm's summation order, spelled out (kernels/cpu/elementwise_ops.cpp):
// a plane's terms in 16 float lanes (the tail straight into double, then the lanes in
// order), each (chunk, channel) sum its images' plane sums in order from +0, then the
// fixed tree over the chunks. Whichever loop order the kernels take, these bits.
template <class Term>
double sixteen_lane_plane_sum(int hw, Term term) {
  float lanes[16] = {};
  int i = 0;
  for (; i + 16 <= hw; i += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += term(i + j);
  double total = 0.0;
  for (; i < hw; ++i) total += term(i);
  for (float l : lanes) total += l;
  return total;
}

template <class Term>  // Term(n, c, i): the term of image n, channel c, pixel i
std::vector<double> channel_sums_in_order(const BatchNormShape& s, const Share& sh, Term term) {
  std::vector<double> out(s.c);
  for (int c = 0; c < s.c; ++c) {
    std::vector<double> part(kTreeChunks, 0.0);
    for (int k = 0; k < sh.chunks; ++k)
      for (int n = sh.bounds[k]; n < sh.bounds[k + 1]; ++n)
        part[k] += sixteen_lane_plane_sum(s.hw, [&](int i) { return term(n, c, i); });
    out[c] = engine::kernels::tree_sum(part.data(), sh.chunks);
  }
  return out;
}

CPU_CASE("cpu sums: each channel's planes in image order within a chunk, 16 lanes a plane, then the tree", batchnorm_chunk_sums, batchnorm_chunk_centered_squares, batchnorm_backward_chunk_sums) {
  // Plane sums of a few float terms add exactly in double unless their magnitudes are far
  // apart, so each image gets its own power-of-two scale: then the order shows in the bits.
  std::mt19937 g(29);
  std::vector<BatchNormShape> shapes(std::begin(kBn), std::end(kBn));
  shapes.push_back({64, 3, 20});  // 8 images a chunk
  for (const BatchNormShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.hw);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.hw;
    auto x = uniform(nx, g, -1, 3), dy = uniform(nx, g, -1, 1);
    const auto mean = uniform(s.c, g, 0, 1);
    for (std::size_t e = 0; e < nx; ++e) {
      const int n = static_cast<int>(e / (static_cast<std::size_t>(s.c) * s.hw));
      x[e] = std::ldexp(x[e], (n * 13) % 41 - 20);
      dy[e] = std::ldexp(dy[e], (n * 11) % 41 - 20);
    }
    auto at = [&](const std::vector<float>& t, int n, int c, int i) {
      return t[(static_cast<std::size_t>(n) * s.c + c) * s.hw + i];
    };
    for (int world : {1, 2}) {
      CAPTURE(world);
      const Share sh = share(s.n, 0, world);
      BatchNormShape sl = s;
      sl.n = sh.count;
      std::vector<double> sum(s.c), sq(s.c), sdy(s.c), sxc(s.c);
      cpu::batchnorm_chunk_sums(sl, sh.chunks, sh.bounds.data(), x.data(), sum.data());
      cpu::batchnorm_chunk_centered_squares(sl, sh.chunks, sh.bounds.data(), x.data(), mean.data(), sq.data());
      cpu::batchnorm_backward_chunk_sums(sl, sh.chunks, sh.bounds.data(), x.data(), dy.data(), mean.data(),
                                         sdy.data(), sxc.data());
      check_bits("bn sums in order", sum, channel_sums_in_order(sl, sh, [&](int n, int c, int i) { return at(x, n, c, i); }));
      check_bits("bn centred squares in order", sq, channel_sums_in_order(sl, sh, [&](int n, int c, int i) {
                   const float d = at(x, n, c, i) - mean[c];
                   return d * d;
                 }));
      check_bits("bn sums of dy in order", sdy,
                 channel_sums_in_order(sl, sh, [&](int n, int c, int i) { return at(dy, n, c, i); }));
      check_bits("bn sums of dy * (x - mean) in order", sxc, channel_sums_in_order(sl, sh, [&](int n, int c, int i) {
                   return at(dy, n, c, i) * (at(x, n, c, i) - mean[c]);
                 }));
    }
  }
}

CPU_CASE("steps over channel ranges: the range's channels bit for bit as over every channel, the rest untouched", batchnorm_chunk_sums, batchnorm_chunk_centered_squares, batchnorm_scale_shift, batchnorm_backward_chunk_sums, batchnorm_backward_apply) {
  // A rank's driver walks the channels in groups that stay in cache between its
  // exchanges (engine/core/batchnorm_ops.cpp); any grouping must give the same bits.
  std::mt19937 g(17);
  for (const BatchNormShape& s : kBn) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.hw);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.hw, nc = static_cast<std::size_t>(s.c);
    auto x = uniform(nx, g, -1, 1);
    const auto dy = uniform(nx, g, -1, 1), mean = uniform(nc, g, -0.5f, 0.5f), scale = uniform(nc, g, 0.5f, 1.5f),
               shift = uniform(nc, g, -1, 1), k = uniform(nc, g, 0.5f, 1.5f), mdy = uniform(nc, g, -0.1f, 0.1f),
               proj = uniform(nc, g, -0.3f, 0.3f);
    const Share all = whole(s.n);
    const int* b = all.bounds.data();
    // Every step of one backend over [c0, c1) into outputs that start as sentinels.
    struct Outputs {
      std::vector<double> sum, sq, sdy, sxc;
      std::vector<float> y, dx;
    };
    constexpr double kSentinelD = -7.25;
    constexpr float kSentinelF = -3.5f;
    auto run = [&](bool cpu_path, int c0, int c1) {
      BatchNormShape r = s;
      r.c_begin = c0;
      r.c_end = c1;
      Outputs o{std::vector<double>(nc, kSentinelD), std::vector<double>(nc, kSentinelD),
                std::vector<double>(nc, kSentinelD), std::vector<double>(nc, kSentinelD),
                std::vector<float>(nx, kSentinelF), std::vector<float>(nx, kSentinelF)};
      if (cpu_path) {
        cpu::batchnorm_chunk_sums(r, all.chunks, b, x.data(), o.sum.data());
        cpu::batchnorm_chunk_centered_squares(r, all.chunks, b, x.data(), mean.data(), o.sq.data());
        cpu::batchnorm_scale_shift(r, x.data(), scale.data(), shift.data(), o.y.data());
        cpu::batchnorm_backward_chunk_sums(r, all.chunks, b, x.data(), dy.data(), mean.data(), o.sdy.data(),
                                           o.sxc.data());
        cpu::batchnorm_backward_apply(r, x.data(), dy.data(), mean.data(), k.data(), mdy.data(), proj.data(),
                                      o.dx.data());
      } else {
        ref::batchnorm_chunk_sums(r, all.chunks, b, x.data(), o.sum.data());
        ref::batchnorm_chunk_centered_squares(r, all.chunks, b, x.data(), mean.data(), o.sq.data());
        ref::batchnorm_scale_shift(r, x.data(), scale.data(), shift.data(), o.y.data());
        ref::batchnorm_backward_chunk_sums(r, all.chunks, b, x.data(), dy.data(), mean.data(), o.sdy.data(),
                                           o.sxc.data());
        ref::batchnorm_backward_apply(r, x.data(), dy.data(), mean.data(), k.data(), mdy.data(), proj.data(),
                                      o.dx.data());
      }
      return o;
    };
    for (bool cpu_path : {true, false}) {
      CAPTURE(cpu_path);
      const Outputs every = run(cpu_path, 0, s.c);
      for (int group : {1, 3, s.c}) {
        CAPTURE(group);
        Outputs pieced{std::vector<double>(nc, kSentinelD), std::vector<double>(nc, kSentinelD),
                       std::vector<double>(nc, kSentinelD), std::vector<double>(nc, kSentinelD),
                       std::vector<float>(nx, kSentinelF), std::vector<float>(nx, kSentinelF)};
        for (int c0 = 0; c0 < s.c; c0 += group) {
          const int c1 = std::min(s.c, c0 + group);
          const Outputs o = run(cpu_path, c0, c1);
          for (int c = 0; c < s.c; ++c) {
            const bool in = c >= c0 && c < c1;
            const std::size_t j = static_cast<std::size_t>(c);
            if (in) {
              pieced.sum[j] = o.sum[j], pieced.sq[j] = o.sq[j], pieced.sdy[j] = o.sdy[j], pieced.sxc[j] = o.sxc[j];
            } else {
              CHECK(o.sum[j] == kSentinelD);
              CHECK(o.sq[j] == kSentinelD);
              CHECK(o.sdy[j] == kSentinelD);
              CHECK(o.sxc[j] == kSentinelD);
            }
          }
          std::size_t outside_written = 0;
          for (std::size_t e = 0; e < nx; ++e) {
            const int c = static_cast<int>((e / static_cast<std::size_t>(s.hw)) % nc);
            if (c >= c0 && c < c1) {
              pieced.y[e] = o.y[e];
              pieced.dx[e] = o.dx[e];
            } else {
              outside_written += o.y[e] != kSentinelF || o.dx[e] != kSentinelF;
            }
          }
          CHECK_MESSAGE(outside_written == 0, "channels [" << c0 << ", " << c1 << "): " << outside_written
                                                           << " elements outside the range written");
        }
        check_bits("sums by ranges", pieced.sum, every.sum);
        check_bits("centred squares by ranges", pieced.sq, every.sq);
        check_bits("scale_shift by ranges", pieced.y, every.y);
        check_bits("sum dy by ranges", pieced.sdy, every.sdy);
        check_bits("sum dy*xc by ranges", pieced.sxc, every.sxc);
        check_bits("backward_apply by ranges", pieced.dx, every.dx);
      }
    }
  }
}

TEST_CASE("ref chunked backward ops match finite differences") {
  std::mt19937 g(15);
  SUBCASE("conv2d_backward_chunks (5 samples over 8 chunks, some empty)") {
    const ConvShape s{5, 2, 5, 4, 3, 3, 3, 1};
    const Share all = whole(s.n);
    const std::size_t in = static_cast<std::size_t>(s.c) * s.h * s.w, out = static_cast<std::size_t>(s.k) * s.out_h() * s.out_w();
    auto x = uniform(in * s.n, g, -1, 1), w = uniform(static_cast<std::size_t>(s.k) * s.c * 9, g, -0.5f, 0.5f);
    auto b = uniform(s.k, g, -1, 1);
    const auto r = uniform(out * s.n, g, -1, 1);
    auto loss = [&] {
      std::vector<float> y(out * s.n);
      ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{all.chunks, all.bounds.data()}, x.data(), w.data(), b.data(), y.data());
      return gradcheck::dot(y, r);
    };
    std::vector<float> dx(x.size()), dw(w.size()), db(s.k);
    std::vector<double> dbd(s.k);
    ref::conv2d_backward_chunks(s, engine::Precision::Fp32, all.chunks, all.bounds.data(), x.data(), w.data(), r.data(), dx.data(), dw.data(),
                                dbd.data());
    for (int k = 0; k < s.k; ++k) db[k] = static_cast<float>(dbd[k]);
    CHECK_GRAD("conv dx", gradcheck::check(loss, x.data(), static_cast<int64_t>(x.size()), dx.data()));
    CHECK_GRAD("conv dw", gradcheck::check(loss, w.data(), static_cast<int64_t>(w.size()), dw.data()));
    CHECK_GRAD("conv db", gradcheck::check(loss, b.data(), s.k, db.data()));
  }
  SUBCASE("linear_backward_chunks") {
    const LinearShape s{13, 7, 4};
    const Share all = whole(s.n);
    auto x = uniform(static_cast<std::size_t>(s.n) * s.in, g, -1, 1), w = uniform(static_cast<std::size_t>(s.out) * s.in, g, -0.5f, 0.5f);
    auto b = uniform(s.out, g, -1, 1);
    const auto r = uniform(static_cast<std::size_t>(s.n) * s.out, g, -1, 1);
    auto loss = [&] {
      std::vector<float> y(r.size());
      ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{all.chunks, all.bounds.data()}, x.data(), w.data(), b.data(), y.data());
      return gradcheck::dot(y, r);
    };
    std::vector<float> dx(x.size()), dw(w.size()), db(s.out);
    std::vector<double> dbd(s.out);
    ref::linear_backward_chunks(s, engine::Precision::Fp32, all.chunks, all.bounds.data(), x.data(), w.data(), r.data(), dx.data(), dw.data(),
                                dbd.data());
    for (int o = 0; o < s.out; ++o) db[o] = static_cast<float>(dbd[o]);
    CHECK_GRAD("linear dx", gradcheck::check(loss, x.data(), static_cast<int64_t>(x.size()), dx.data()));
    CHECK_GRAD("linear dw", gradcheck::check(loss, w.data(), static_cast<int64_t>(w.size()), dw.data()));
    CHECK_GRAD("linear db", gradcheck::check(loss, b.data(), s.out, db.data()));
  }
  SUBCASE("training-mode batch norm from the chunked ops (forward: sums, centred squares, scale/shift; "
          "backward: chunk sums, apply), as BatchNorm2d composes them") {
    const BatchNormShape s{6, 3, 5};
    const Share all = whole(s.n);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.hw;
    auto x = uniform(nx, g, -1, 1);
    for (float& v : x) v = 0.5f + 1.5f * v;
    auto gamma = uniform(s.c, g, 0.5f, 1.5f), beta = uniform(s.c, g, -1, 1);
    const auto r = uniform(nx, g, -1, 1);
    const double m = static_cast<double>(s.n) * s.hw;
    const float eps = 1e-5f;
    // Forward, returning mean and invstd for the backward.
    auto forward = [&](std::vector<float>& y, std::vector<float>& mean, std::vector<float>& invstd) {
      std::vector<double> sum(s.c), sq(s.c);
      ref::batchnorm_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), sum.data());
      mean.assign(s.c, 0);
      for (int c = 0; c < s.c; ++c) mean[c] = static_cast<float>(sum[c] / m);
      ref::batchnorm_chunk_centered_squares(s, all.chunks, all.bounds.data(), x.data(), mean.data(), sq.data());
      std::vector<float> scale(s.c), shift(s.c);
      invstd.assign(s.c, 0);
      for (int c = 0; c < s.c; ++c) {
        const double is = 1.0 / std::sqrt(sq[c] / m + eps);
        invstd[c] = static_cast<float>(is);
        scale[c] = static_cast<float>(is * gamma[c]);
        shift[c] = static_cast<float>(beta[c] - sum[c] / m * is * gamma[c]);
      }
      y.assign(nx, 0);
      ref::batchnorm_scale_shift(s, x.data(), scale.data(), shift.data(), y.data());
    };
    auto loss = [&] {
      std::vector<float> y, mean, invstd;
      forward(y, mean, invstd);
      return gradcheck::dot(y, r);
    };
    std::vector<float> y, mean, invstd;
    forward(y, mean, invstd);
    std::vector<double> sdy(s.c), sxc(s.c);
    ref::batchnorm_backward_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), r.data(), mean.data(), sdy.data(),
                                       sxc.data());
    std::vector<float> k(s.c), mean_dy(s.c), proj(s.c), dgamma(s.c), dbeta(s.c), dx(nx);
    for (int c = 0; c < s.c; ++c) {
      const double sum_dy_xhat = sxc[c] * invstd[c];
      k[c] = gamma[c] * invstd[c];
      mean_dy[c] = static_cast<float>(sdy[c] / m);
      proj[c] = static_cast<float>(sum_dy_xhat / m * invstd[c]);
      dgamma[c] = static_cast<float>(sum_dy_xhat);
      dbeta[c] = static_cast<float>(sdy[c]);
    }
    ref::batchnorm_backward_apply(s, x.data(), r.data(), mean.data(), k.data(), mean_dy.data(), proj.data(),
                                  dx.data());
    CHECK_GRAD("bn dx", gradcheck::check(loss, x.data(), static_cast<int64_t>(nx), dx.data()));
    CHECK_GRAD("bn dgamma", gradcheck::check(loss, gamma.data(), s.c, dgamma.data()));
    CHECK_GRAD("bn dbeta", gradcheck::check(loss, beta.data(), s.c, dbeta.data()));
  }
}

CPU_CASE("fused one-process batch norm = its separate steps with kernels/batchnorm_math.h, bit for bit; cpu ~ ref", batchnorm_forward_train, batchnorm_backward) {
  std::mt19937 g(16);
  for (const BatchNormShape& s : kBn) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.hw;
    auto x = uniform(nx, g, -1, 1);
    for (float& v : x) v = 1.0f + 2.0f * v;
    const auto dy = uniform(nx, g, -1, 1), gamma = uniform(s.c, g, 0.5f, 1.5f), beta = uniform(s.c, g, -1, 1);
    const Share all = whole(s.n);
    const double m = static_cast<double>(s.n) * s.hw;
    const float eps = 1e-5f, momentum = 0.1f;

    std::vector<float> rm(s.c, 0.1f), rv(s.c, 0.9f), sm(s.c), si(s.c), y(nx);
    cpu::batchnorm_forward_train(s, BatchSplit{all.chunks, all.bounds.data()}, x.data(), gamma.data(), beta.data(), eps,
                                        momentum, rm.data(), rv.data(), sm.data(), si.data(), y.data());
    // The steps, as BatchNorm2d runs them across ranks.
    std::vector<double> sum(s.c), sq(s.c);
    std::vector<float> mean(s.c), scale(s.c), shift(s.c), rm2(s.c, 0.1f), rv2(s.c, 0.9f), sm2(s.c), si2(s.c), y2(nx);
    cpu::batchnorm_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), sum.data());
    for (int c = 0; c < s.c; ++c) mean[c] = static_cast<float>(engine::kernels::bn_mean(sum[c], m));
    cpu::batchnorm_chunk_centered_squares(s, all.chunks, all.bounds.data(), x.data(), mean.data(), sq.data());
    for (int c = 0; c < s.c; ++c) {
      const auto f = engine::kernels::bn_forward_finish(sum[c], sq[c], m, gamma[c], beta[c], eps, momentum, rm2[c], rv2[c]);
      scale[c] = f.scale;
      shift[c] = f.shift;
      sm2[c] = f.save_mean;
      si2[c] = f.save_invstd;
    }
    cpu::batchnorm_scale_shift(s, x.data(), scale.data(), shift.data(), y2.data());
    check_bits("bn fused y", y, y2);
    check_bits("bn fused running mean", rm, rm2);
    check_bits("bn fused running var", rv, rv2);
    check_bits("bn fused save mean", sm, sm2);
    check_bits("bn fused save invstd", si, si2);
    // Against the reference batch norm (the unchunked definition).
    std::vector<float> rm3(s.c, 0.1f), rv3(s.c, 0.9f), sm3(s.c), si3(s.c), y3(nx);
    ref::batchnorm_forward_train(s, BatchSplit{}, x.data(), gamma.data(), beta.data(), eps, momentum, rm3.data(), rv3.data(),
                                 sm3.data(), si3.data(), y3.data());
    check_close("bn fused y vs ref", y, y3, [&](std::size_t j) { return 1e-5 * (1.0 + std::fabs(y3[j])); });

    std::vector<float> dx(nx), dg(s.c), db(s.c), dx2(nx), dg2(s.c), db2(s.c);
    cpu::batchnorm_backward(s, BatchSplit{all.chunks, all.bounds.data()}, x.data(), dy.data(), gamma.data(), sm.data(),
                                   si.data(), dx.data(), dg.data(), db.data());
    std::vector<double> sdy(s.c), sxc(s.c);
    std::vector<float> k(s.c), mdy(s.c), proj(s.c);
    cpu::batchnorm_backward_chunk_sums(s, all.chunks, all.bounds.data(), x.data(), dy.data(), sm.data(), sdy.data(),
                                       sxc.data());
    for (int c = 0; c < s.c; ++c) {
      const auto f = engine::kernels::bn_backward_finish(sdy[c], sxc[c], m, gamma[c], si[c]);
      k[c] = f.k;
      mdy[c] = f.mean_dy;
      proj[c] = f.proj;
      dg2[c] = f.dgamma;
      db2[c] = f.dbeta;
    }
    cpu::batchnorm_backward_apply(s, x.data(), dy.data(), sm.data(), k.data(), mdy.data(), proj.data(), dx2.data());
    check_bits("bn fused dx", dx, dx2);
    check_bits("bn fused dgamma", dg, dg2);
    check_bits("bn fused dbeta", db, db2);
    std::vector<float> dx3(nx), dg3(s.c), db3(s.c);
    ref::batchnorm_backward(s, BatchSplit{}, x.data(), dy.data(), gamma.data(), sm.data(), si.data(), dx3.data(), dg3.data(),
                            db3.data());
    check_close("bn fused dx vs ref", dx, dx3, [&](std::size_t j) { return 1e-5 * (1.0 + std::fabs(dx3[j])); });
    // The ref fused op is the ref steps: close to the cpu one.
    std::vector<float> rdx(nx), rdg(s.c), rdb(s.c);
    ref::batchnorm_backward(s, BatchSplit{all.chunks, all.bounds.data()}, x.data(), dy.data(), gamma.data(), sm.data(),
                                   si.data(), rdx.data(), rdg.data(), rdb.data());
    check_close("bn ref fused dx", rdx, dx3, [&](std::size_t j) { return 1e-5 * (1.0 + std::fabs(dx3[j])); });
  }
}

CPU_CASE("chunked conv, linear and batch norm give the same bits with 1, 2 and 3 threads", conv2d_backward_chunks, linear_backward_chunks, batchnorm_forward_train, batchnorm_backward) {
  std::mt19937 g(17);
  const ConvShape cs{13, 3, 6, 5, 7, 3, 3, 1};
  const LinearShape ls{24, 3136, 16};
  const BatchNormShape bs{13, 7, 30};
  const auto cx = uniform(static_cast<std::size_t>(cs.n) * cs.c * cs.h * cs.w, g, -1, 1);
  const auto cw = uniform(static_cast<std::size_t>(cs.k) * cs.c * 9, g, -0.3f, 0.3f);
  const auto cdy = uniform(static_cast<std::size_t>(cs.n) * cs.k * cs.out_h() * cs.out_w(), g, -1, 1);
  const auto lx = uniform(static_cast<std::size_t>(ls.n) * ls.in, g, -1, 1);
  const auto lw = uniform(static_cast<std::size_t>(ls.out) * ls.in, g, -0.1f, 0.1f);
  const auto ldy = uniform(static_cast<std::size_t>(ls.n) * ls.out, g, -1, 1);
  const auto bx = uniform(static_cast<std::size_t>(bs.n) * bs.c * bs.hw, g, -1, 1);
  const auto bdy = uniform(bx.size(), g, -1, 1), gamma = uniform(bs.c, g, 0.5f, 1.5f), beta = uniform(bs.c, g, -1, 1);
  auto run = [&] {
    std::vector<float> out;
    auto add = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
    Share a = whole(cs.n);
    std::vector<float> dx(cx.size()), dw(cw.size());
    std::vector<double> db(cs.k);
    cpu::conv2d_backward_chunks(cs, engine::Precision::Fp32, a.chunks, a.bounds.data(), cx.data(), cw.data(), cdy.data(), dx.data(), dw.data(), db.data());
    add(dx);
    add(dw);
    for (double d : db) out.push_back(static_cast<float>(d));
    a = whole(ls.n);
    std::vector<float> ldx(lx.size()), ldw(lw.size());
    std::vector<double> ldb(ls.out);
    cpu::linear_backward_chunks(ls, engine::Precision::Fp32, a.chunks, a.bounds.data(), lx.data(), lw.data(), ldy.data(), ldx.data(), ldw.data(), ldb.data());
    add(ldx);
    add(ldw);
    a = whole(bs.n);
    std::vector<float> rm(bs.c, 0), rv(bs.c, 1), sm(bs.c), si(bs.c), y(bx.size()), bdx(bx.size()), dg(bs.c), dbb(bs.c);
    cpu::batchnorm_forward_train(bs, BatchSplit{a.chunks, a.bounds.data()}, bx.data(), gamma.data(), beta.data(), 1e-5f, 0.1f,
                                        rm.data(), rv.data(), sm.data(), si.data(), y.data());
    cpu::batchnorm_backward(bs, BatchSplit{a.chunks, a.bounds.data()}, bx.data(), bdy.data(), gamma.data(), sm.data(), si.data(),
                                   bdx.data(), dg.data(), dbb.data());
    add(y);
    add(rv);
    add(bdx);
    add(dg);
    return out;
  };
  omp_set_num_threads(1);
  const auto one = run();
  for (int t : {2, 3}) {
    CAPTURE(t);
    omp_set_num_threads(t);
    check_bits("threads", run(), one);
  }
  omp_set_num_threads(2);
}
