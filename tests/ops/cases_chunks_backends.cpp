// Every backend's chunked ops against the reference chunked ops (ragged shapes, empty
// chunks), the rank decomposition through tree_sum_parts (cuda), and the fp16 forms.
#include "ops/harness.h"

using namespace ops_test;

namespace {
// Outputs and weight gradients: 1e-4 of max(1, max|want|); double channel sums 1e-12 of
// the sum of magnitudes; the bias-gradient tree 2 u sum|dy| (the reference rounds each
// chunk's sum to float before the tree, cuda keeps doubles). The cpu chunked ops are held
// to the tight bounds in cases_chunks_cpu.cpp; here the same loose bounds for every backend.
template <class T>
void check_scaled(const std::string& what, const std::vector<T>& got, const std::vector<T>& want, double rel,
                  double scale = -1) {
  if (scale < 0) {
    scale = 1.0;
    for (T v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  }
  check_close(what, got, want, [&](std::size_t) { return rel * scale; });
}
constexpr double kChunkDbRel = 2.0 * 0x1p-24;
}  // namespace

OP_CASE("against the ref chunked ops, every chunk shape (empty chunks too); deterministic", conv2d_forward,
        conv2d_backward_chunks, linear_forward, linear_backward_chunks) {
  std::mt19937 g(7);
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
    const float *xd = m.in(x), *wd = m.in(w), *dyd = m.in(dy);
    float *y = m.out<float>(yn), *dx = m.out<float>(xn), *dw = m.out<float>(wn);
    double* db = m.out<double>(s.k);
    b.ops->conv2d_forward(s, engine::Precision::Fp32, BatchSplit{kTreeChunks, bd.data()}, xd, wd, m.in(bias), y);
    b.ops->conv2d_backward_chunks(s, engine::Precision::Fp32, kTreeChunks, bd.data(), xd, wd, dyd, dx, dw, db);
    check_scaled("conv y", m.get(y), y_ref, 1e-4);
    check_scaled("conv dx", m.get(dx), dx_ref, 1e-4);
    const auto dw1 = m.get(dw);
    check_scaled("conv dw", dw1, dw_ref, 1e-4);
    check_scaled("conv db", m.get(db), db_ref, kChunkDbRel, sum_abs(dy));
    b.ops->conv2d_backward_chunks(s, engine::Precision::Fp32, kTreeChunks, bd.data(), xd, wd, dyd, dx, dw, db);
    check_bits("conv dw again", m.get(dw), dw1);
  }
  for (std::size_t t = 0; t < kLinearShapeCount; ++t) {
    if (!kLinearShapes[t].chunks) continue;
    const LinearShape s = kLinearShapes[t].s;
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const ChunkedLayerCase c = chunked_case(s, g, 1.0f);
    const std::vector<int>& bd = c.bounds;
    const auto &x = c.x, &w = c.w, &bias = c.bias, &dy = c.dy;
    const auto &y_ref = c.y_ref, &dx_ref = c.dx_ref, &dw_ref = c.dw_ref;
    const auto& db_ref = c.db_ref;
    Mem m(b);
    const float *xd = m.in(x), *wd = m.in(w);
    float *y = m.out<float>(dy.size()), *dx = m.out<float>(x.size()), *dw = m.out<float>(w.size());
    double* db = m.out<double>(s.out);
    b.ops->linear_forward(s, engine::Precision::Fp32, BatchSplit{kTreeChunks, bd.data()}, xd, wd, m.in(bias), y);
    b.ops->linear_backward_chunks(s, engine::Precision::Fp32, kTreeChunks, bd.data(), xd, wd, m.in(dy), dx, dw, db);
    check_scaled("linear y", m.get(y), y_ref, 1e-4);
    check_scaled("linear dx", m.get(dx), dx_ref, 1e-4);
    check_scaled("linear dw", m.get(dw), dw_ref, 1e-4);
    check_scaled("linear db", m.get(db), db_ref, kChunkDbRel, sum_abs(dy));
  }
}

OP_CASE("sums, centred squares, backward sums, scale/shift, apply and the fused ops against the ref chunked ops",
        batchnorm_chunk_sums, batchnorm_chunk_centered_squares, batchnorm_backward_chunk_sums, batchnorm_scale_shift,
        batchnorm_backward_apply, batchnorm_forward_train, batchnorm_backward) {
  std::mt19937 g(11);
  for (int n : {13, 5}) {
    CAPTURE(n);
    const std::vector<int> bd = whole(n).bounds;
    const BatchNormShape s{n, 5, 36};
    const std::size_t total = static_cast<std::size_t>(n) * 5 * 36;
    const auto x = uniform(total, g, -2.0f, 3.0f), dy = uniform(total, g), gamma = uniform(5, g, 0.5f, 1.5f),
               beta = uniform(5, g), mean = uniform(5, g), scale = uniform(5, g, 0.5f, 1.5f), shift = uniform(5, g),
               k = uniform(5, g, 0.5f, 1.5f), mdy = uniform(5, g, -0.1f, 0.1f), proj = uniform(5, g, -0.3f, 0.3f);
    std::vector<double> sum_ref(5), sq_ref(5), sdy_ref(5), sxc_ref(5);
    ref::batchnorm_chunk_sums(s, kTreeChunks, bd.data(), x.data(), sum_ref.data());
    ref::batchnorm_chunk_centered_squares(s, kTreeChunks, bd.data(), x.data(), mean.data(), sq_ref.data());
    ref::batchnorm_backward_chunk_sums(s, kTreeChunks, bd.data(), x.data(), dy.data(), mean.data(), sdy_ref.data(),
                                       sxc_ref.data());
    Mem m(b);
    const float *xd = m.in(x), *dyd = m.in(dy), *gd = m.in(gamma), *md = m.in(mean);
    double *sum = m.out<double>(5), *sq = m.out<double>(5), *sdy = m.out<double>(5), *sxc = m.out<double>(5);
    b.ops->batchnorm_chunk_sums(s, kTreeChunks, bd.data(), xd, sum);
    b.ops->batchnorm_chunk_centered_squares(s, kTreeChunks, bd.data(), xd, md, sq);
    b.ops->batchnorm_backward_chunk_sums(s, kTreeChunks, bd.data(), xd, dyd, md, sdy, sxc);
    const double mag = 16.0 * static_cast<double>(total);  // |x| <= 3, |x - mean| <= 4: sums of magnitudes
    // cuda sums in double (1e-12); the cpu in float lanes (sum_tol's 16 u sqrt(T), held
    // to the tight per-channel bounds in cases_chunks_cpu.cpp).
    const double rel = b.cuda ? 1e-12 : 16.0 * kU * std::sqrt(static_cast<double>(n) * 36 + kTreeChunks);
    check_scaled("sum x", m.get(sum), sum_ref, rel, mag);
    check_scaled("sum (x - mean)^2", m.get(sq), sq_ref, rel, mag);
    check_scaled("sum dy", m.get(sdy), sdy_ref, rel, mag);
    check_scaled("sum dy (x - mean)", m.get(sxc), sxc_ref, rel, mag);

    std::vector<float> y_ref(total), dx_ref(total);
    ref::batchnorm_scale_shift(s, x.data(), scale.data(), shift.data(), y_ref.data());
    ref::batchnorm_backward_apply(s, x.data(), dy.data(), mean.data(), k.data(), mdy.data(), proj.data(), dx_ref.data());
    float *y = m.out<float>(total), *dx = m.out<float>(total);
    b.ops->batchnorm_scale_shift(s, xd, m.in(scale), m.in(shift), y);
    const float *kd = m.in(k), *mdyd = m.in(mdy), *pd = m.in(proj);
    b.ops->batchnorm_backward_apply(s, xd, dyd, md, kd, mdyd, pd, dx);
    check_scaled("bn scale_shift", m.get(y), y_ref, 1e-5);
    const auto dx1 = m.get(dx);
    check_scaled("bn backward_apply", dx1, dx_ref, 1e-5);
    float* inplace = m.in(dy);
    b.ops->batchnorm_backward_apply(s, xd, inplace, md, kd, mdyd, pd, inplace);
    check_bits("bn backward_apply in place", m.get(inplace), dx1);

    // The fused ops.
    std::vector<float> rm_ref(5, 0.1f), rv_ref(5, 0.9f), sm_ref(5), si_ref(5), yf_ref(total), dxf_ref(total), dg_ref(5),
        db_ref(5);
    float *rm = m.in(rm_ref), *rv = m.in(rv_ref), *sm = m.out<float>(5), *si = m.out<float>(5), *yf = m.out<float>(total),
          *dxf = m.out<float>(total), *dg = m.out<float>(5), *db = m.out<float>(5);
    ref::batchnorm_forward_train(s, BatchSplit{kTreeChunks, bd.data()}, x.data(), gamma.data(), beta.data(), 1e-5f, 0.1f,
                                        rm_ref.data(), rv_ref.data(), sm_ref.data(), si_ref.data(), yf_ref.data());
    b.ops->batchnorm_forward_train(s, BatchSplit{kTreeChunks, bd.data()}, xd, gd, m.in(beta), 1e-5f, 0.1f, rm, rv, sm, si, yf);
    check_scaled("bn y", m.get(yf), yf_ref, 1e-5);
    check_scaled("running mean", m.get(rm), rm_ref, 1e-6);
    check_scaled("running var", m.get(rv), rv_ref, 1e-6);
    check_scaled("save mean", m.get(sm), sm_ref, 1e-6);
    check_scaled("save invstd", m.get(si), si_ref, 1e-6);
    ref::batchnorm_backward(s, BatchSplit{kTreeChunks, bd.data()}, x.data(), dy.data(), gamma.data(), sm_ref.data(),
                                   si_ref.data(), dxf_ref.data(), dg_ref.data(), db_ref.data());
    b.ops->batchnorm_backward(s, BatchSplit{kTreeChunks, bd.data()}, xd, dyd, gd, sm, si, dxf, dg, db);
    check_scaled("bn dx", m.get(dxf), dxf_ref, 1e-5);
    check_scaled("bn dgamma", m.get(dg), dg_ref, 1e-5);
    check_scaled("bn dbeta", m.get(db), db_ref, 1e-5);
  }
}

// Rank shares gathered and finished by tree_sum_parts: the whole batch by 8 chunks, bit
// for bit (the cpu's host form, tree_sum_in_place, is checked in cases_chunks_cpu.cpp).
OP_CASE("rank shares plus the top of the tree give the whole batch, bit for bit (W = 2, 4, 8)",
        tree_sum_parts, tree_sum_parts_f64, conv2d_forward, conv2d_backward_chunks, batchnorm_chunk_sums) {
  std::mt19937 g(5);
  const int n = 29;
  const ConvShape s{n, 2, 6, 6, 3, 3, 3, 1};
  const int64_t in = 2 * 36, out = 3 * 36, wn = 3 * 2 * 9;
  const auto x = uniform(static_cast<std::size_t>(n * in), g), w = uniform(wn, g), bias = uniform(3, g),
             dy = uniform(static_cast<std::size_t>(n * out), g);
  Mem m(b);
  const float *xd = m.in(x), *wd = m.in(w), *bdv = m.in(bias), *dyd = m.in(dy);
  float *y_whole = m.out<float>(n * out), *dw_whole = m.out<float>(wn);
  double *db_whole = m.out<double>(3), *bn_whole = m.out<double>(2);
  const std::vector<int> bd = whole(n).bounds;
  b.ops->conv2d_forward(s, engine::Precision::Fp32, BatchSplit{kTreeChunks, bd.data()}, xd, wd, bdv, y_whole);
  b.ops->conv2d_backward_chunks(s, engine::Precision::Fp32, kTreeChunks, bd.data(), xd, wd, dyd, nullptr, dw_whole, db_whole);
  const BatchNormShape bs{n, 2, 36};
  b.ops->batchnorm_chunk_sums(bs, kTreeChunks, bd.data(), xd, bn_whole);
  const auto y_all = m.get(y_whole);
  for (int world : {2, 4, 8}) {
    CAPTURE(world);
    float* dw_parts = m.out<float>(wn * world);
    double *db_parts = m.out<double>(3 * world), *bn_parts = m.out<double>(2 * world);
    for (int r = 0; r < world; ++r) {
      const Share sh = share(n, r, world);
      ConvShape part = s;
      part.n = sh.count;
      float* y_part = m.out<float>(std::max<int64_t>(1, sh.count * out));
      b.ops->conv2d_forward(part, engine::Precision::Fp32, BatchSplit{sh.chunks, sh.bounds.data()}, xd + sh.first * in, wd, bdv, y_part);
      const auto yp = m.get(y_part);
      CHECK(std::memcmp(yp.data(), y_all.data() + sh.first * out, sizeof(float) * sh.count * out) == 0);
      b.ops->conv2d_backward_chunks(part, engine::Precision::Fp32, sh.chunks, sh.bounds.data(), xd + sh.first * in, wd, dyd + sh.first * out,
                                    nullptr, dw_parts + r * wn, db_parts + r * 3);
      const BatchNormShape bpart{sh.count, 2, 36};
      b.ops->batchnorm_chunk_sums(bpart, sh.chunks, sh.bounds.data(), xd + sh.first * in, bn_parts + r * 2);
    }
    b.ops->tree_sum_parts(world, wn, dw_parts, dw_parts);
    b.ops->tree_sum_parts_f64(world, 3, db_parts, db_parts);
    b.ops->tree_sum_parts_f64(world, 2, bn_parts, bn_parts);
    const auto dwp = m.get(dw_parts);
    const auto dbp = m.get(db_parts), bnp = m.get(bn_parts);
    check_bits("dw by ranks", std::vector<float>(dwp.begin(), dwp.begin() + wn), m.get(dw_whole));
    check_bits("db by ranks", std::vector<double>(dbp.begin(), dbp.begin() + 3), m.get(db_whole));
    check_bits("bn sums by ranks", std::vector<double>(bnp.begin(), bnp.begin() + 2), m.get(bn_whole));
    // The same, summed on the host by the tree.
    check_bits("dw by the host tree", top_of_tree(std::vector<float>(dwp.begin(), dwp.end()), 1, wn),
               std::vector<float>(dwp.begin(), dwp.begin() + wn));
  }
}
