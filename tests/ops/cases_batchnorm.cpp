// Cases of the whole-batch batch-norm ops (training forward, evaluation, backward).
#include "gpu/reduction_bounds.h"
#include "ops/harness.h"

using namespace ops_test;
namespace rb = reduction_bounds;

namespace {

// Shapes: bn1 and bn2 of the model, batch 1/3/13, 1x1 maps, a single element per channel
// (variance 0), then the GPU's slicing of a channel (kernels/cuda/reduction_order.h):
// 1, 4, 1, 7 and 32 slices, and the ragged real shapes of reduction_bounds.h (cuda only).
const BatchNormShape kBnShapes[] = {
    {4, 32, 784}, {4, 64, 196}, {1, 3, 5}, {13, 5, 1}, {3, 7, 4}, {1, 3, 1},
    {4, 3, 25},   {16, 32, 196}, {2, 5, 1}, {128, 8, 49}, {128, 4, 784},
};

std::string bn_name(const BatchNormShape& s) {
  std::ostringstream o;
  o << "bn N" << s.n << " C" << s.c << " HW" << s.hw;
  return o.str();
}
std::size_t bn_channel(const BatchNormShape& s, std::size_t j) {
  return (j / static_cast<std::size_t>(s.hw)) % static_cast<std::size_t>(s.c);
}
void check_bound(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<double>& bound) {
  check_close(what, got, want, [&](std::size_t i) { return bound[i]; }, true);
}

// Train forward, eval forward and backward of one shape against the reference.
void check_batchnorm(const Backend& b, const BatchNormShape& s, std::mt19937& g) {
  CAPTURE(bn_name(s));
  const float eps = 1e-5f, momentum = 0.1f;
  const auto x = bn_input(s, g);
  const auto gamma = uniform(s.c, g, 0.5f, 1.5f);
  const auto beta = uniform(s.c, g, -1.0f, 1.0f);
  const auto rm0 = uniform(s.c, g, -1.0f, 1.0f);
  const auto rv0 = uniform(s.c, g, 0.5f, 2.0f);
  const auto dy = uniform(x.size(), g, -1.0f, 1.0f);
  const std::size_t nx = x.size(), nc = static_cast<std::size_t>(s.c);
  const double m = static_cast<double>(s.n) * s.hw;

  std::vector<float> rm_ref = rm0, rv_ref = rv0, sm_ref(nc), si_ref(nc), y_ref(nx);
  ref::batchnorm_forward_train(s, BatchSplit{}, x.data(), gamma.data(), beta.data(), eps, momentum, rm_ref.data(), rv_ref.data(),
                               sm_ref.data(), si_ref.data(), y_ref.data());
  Mem mem(b);
  const float *xd = mem.in(x), *gd = mem.in(gamma), *bd = mem.in(beta), *dyd = mem.in(dy);
  float *rm = mem.in(rm0), *rv = mem.in(rv0), *sm = mem.out<float>(nc), *si = mem.out<float>(nc),
        *y = mem.out<float>(nx);
  b.ops->batchnorm_forward_train(s, BatchSplit{}, xd, gd, bd, eps, momentum, rm, rv, sm, si, y);
  if (b.cuda) {
    const rb::ForwardTolerances ft =
        rb::forward_tolerances(s, x.data(), gamma.data(), beta.data(), eps, momentum, y_ref, rm_ref, rv_ref, sm_ref, si_ref);
    check_bound("bn train y", mem.get(y), y_ref, ft.y);
    check_bound("bn save_mean", mem.get(sm), sm_ref, ft.save_mean);
    check_bound("bn save_invstd", mem.get(si), si_ref, ft.save_invstd);
    check_bound("bn running_mean", mem.get(rm), rm_ref, ft.running_mean);
    check_bound("bn running_var", mem.get(rv), rv_ref, ft.running_var);
  } else {
    // The mean is a sum of m terms; 1/std comes from a sum of m squares (relative error
    // 16 u sqrt(m), halved by the square root, plus a few roundings).
    std::vector<double> x_abs(nc, 0.0);
    for (std::size_t j = 0; j < nx; ++j) x_abs[bn_channel(s, j)] += std::fabs(x[j]);
    std::vector<double> tol_mean(nc);
    for (int c = 0; c < s.c; ++c) tol_mean[c] = sum_tol(sm_ref[c], x_abs[c] / m, m);
    const double rel_invstd = 4.0 * kU + 16.0 * kU * std::sqrt(m);
    check_close("bn save_mean", mem.get(sm), sm_ref, [&](std::size_t c) { return tol_mean[c]; });
    check_close("bn save_invstd", mem.get(si), si_ref, [&](std::size_t c) { return rel_invstd * std::fabs(si_ref[c]); });
    check_close("bn running_mean", mem.get(rm), rm_ref, [&](std::size_t c) {
      return tol_mean[c] + 2.0 * kU * (std::fabs(rm_ref[c]) + std::fabs(rm0[c]));
    });
    check_close("bn running_var", mem.get(rv), rv_ref, [&](std::size_t c) {
      return 2.0 * rel_invstd * std::fabs(rv_ref[c]) + 2.0 * kU * (std::fabs(rv_ref[c]) + std::fabs(rv0[c]));
    });
    check_close("bn y", mem.get(y), y_ref, [&](std::size_t j) {
      const std::size_t c = bn_channel(s, j);
      const double a = static_cast<double>(si_ref[c]) * gamma[c];
      return 8.0 * kU * (std::fabs(x[j] * a) + std::fabs(sm_ref[c] * a) + std::fabs(beta[c])) +
             std::fabs(a) * tol_mean[c] + std::fabs((static_cast<double>(x[j]) - sm_ref[c]) * a) * rel_invstd + 1e-30;
    });
  }

  // Evaluation: cuda evaluates the same per-element formula (bit for bit); the cpu folds
  // it into x * a + b (8 u of the terms).
  {
    const auto rme = uniform(nc, g, -3.0f, 3.0f), rve = uniform(nc, g, 0.01f, 4.0f);
    std::vector<float> ye_ref(nx);
    ref::batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rme.data(), rve.data(), eps, ye_ref.data());
    float* ye = mem.out<float>(nx);
    b.ops->batchnorm_forward_eval(s, xd, gd, bd, mem.in(rme), mem.in(rve), eps, ye);
    if (b.cuda) {
      check_bits("bn eval y", mem.get(ye), ye_ref);
    } else {
      check_close("bn eval y", mem.get(ye), ye_ref, [&](std::size_t j) {
        const std::size_t c = bn_channel(s, j);
        const double a = gamma[c] / std::sqrt(static_cast<double>(rve[c]) + eps);
        return 8.0 * kU * (std::fabs(x[j] * a) + std::fabs(rme[c] * a) + std::fabs(beta[c])) + 1e-30;
      });
    }
  }

  // Backward from the reference's saved statistics, so only the op itself is compared.
  std::vector<float> dx_ref(nx), dg_ref(nc), db_ref(nc);
  ref::batchnorm_backward(s, BatchSplit{}, x.data(), dy.data(), gamma.data(), sm_ref.data(), si_ref.data(), dx_ref.data(),
                          dg_ref.data(), db_ref.data());
  const float *smd = mem.in(sm_ref), *sid = mem.in(si_ref);
  float *dx = mem.out<float>(nx), *dg = mem.out<float>(nc), *db = mem.out<float>(nc);
  b.ops->batchnorm_backward(s, BatchSplit{}, xd, dyd, gd, smd, sid, dx, dg, db);
  const auto dx1 = mem.get(dx), dg1 = mem.get(dg), db1 = mem.get(db);
  if (b.cuda) {
    const rb::BackwardTolerances bt = rb::backward_tolerances(s, x.data(), dy.data(), gamma.data(), sm_ref.data(),
                                                              si_ref.data(), dx_ref, dg_ref, db_ref);
    check_bound("bn dx", dx1, dx_ref, bt.dx);
    check_bound("bn dgamma", dg1, dg_ref, bt.dgamma);
    check_bound("bn dbeta", db1, db_ref, bt.dbeta);
  } else {
    const auto& sm1 = sm_ref;
    const auto& si1 = si_ref;
    std::vector<double> sdy(nc, 0.0), sady(nc, 0.0), sdyxc(nc, 0.0), sadyxc(nc, 0.0);
    for (std::size_t j = 0; j < nx; ++j) {
      const std::size_t c = bn_channel(s, j);
      const double xc = static_cast<double>(x[j]) - sm1[c];
      sdy[c] += dy[j];
      sady[c] += std::fabs(dy[j]);
      sdyxc[c] += dy[j] * xc;
      sadyxc[c] += std::fabs(dy[j] * xc);
    }
    // dx = k (dy - mean_dy - (x - mean) proj): roundings of each part, plus the sums'
    // tolerances (sum_tol without its ulp term).
    const double sum_rel = 16.0 * kU * std::sqrt(m) + 4.0 * kU;
    check_close("bn dx", dx1, dx_ref, [&](std::size_t j) {
      const std::size_t c = bn_channel(s, j);
      const double k = static_cast<double>(gamma[c]) * si1[c];
      const double proj = sdyxc[c] * si1[c] * si1[c] / m;
      const double xc = std::fabs(static_cast<double>(x[j]) - sm1[c]);
      const double err_mean_dy = sum_rel * sady[c] / m;
      const double err_proj = sum_rel * sadyxc[c] * si1[c] * si1[c] / m;
      return kU * std::fabs(dx_ref[j]) +
             std::fabs(k) * (8.0 * kU * (std::fabs(dy[j]) + std::fabs(sdy[c] / m) + xc * std::fabs(proj)) +
                             err_mean_dy + xc * err_proj) +
             1e-30;
    });
    check_close("bn dgamma", dg1, dg_ref,
                [&](std::size_t c) { return 2.0 * kU * std::fabs(dg_ref[c]) + sum_rel * si1[c] * sadyxc[c] + 1e-30; });
    check_close("bn dbeta", db1, db_ref, [&](std::size_t c) { return sum_tol(db_ref[c], sady[c], m); });
  }

  // In place (dx == dy): every part reads its dy before writing dx there, so in place
  // equals out of place, bit for bit.
  float* inplace = mem.in(dy);
  float *dg2 = mem.out<float>(nc), *db2 = mem.out<float>(nc);
  b.ops->batchnorm_backward(s, BatchSplit{}, xd, inplace, gd, smd, sid, inplace, dg2, db2);
  check_bits("bn dx in place", mem.get(inplace), dx1);
  check_bits("bn dgamma (in-place call)", mem.get(dg2), dg1);
  check_bits("bn dbeta (in-place call)", mem.get(db2), db1);

  // The statistics themselves (independent of both backends): mean, biased variance for
  // the normalisation, unbiased for the running estimate.
  for (int c = 0; c < s.c; ++c) {
    double sum = 0.0, sq = 0.0;
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) sum += x[(static_cast<std::size_t>(n) * s.c + c) * s.hw + i];
    const double mean = sum / m;
    for (int n = 0; n < s.n; ++n)
      for (int i = 0; i < s.hw; ++i) {
        const double d = x[(static_cast<std::size_t>(n) * s.c + c) * s.hw + i] - mean;
        sq += d * d;
      }
    CHECK(sm_ref[c] == doctest::Approx(mean).epsilon(1e-6).scale(std::fabs(mean) + 1e-3));
    CHECK(si_ref[c] == doctest::Approx(1.0 / std::sqrt(sq / m + eps)).epsilon(1e-6));
    const double unbiased = m > 1 ? sq / (m - 1) : sq / m;
    CHECK(rv_ref[c] == doctest::Approx(0.9 * rv0[c] + 0.1 * unbiased).epsilon(1e-6));
    CHECK(rm_ref[c] == doctest::Approx(0.9 * rm0[c] + 0.1 * mean).epsilon(1e-6).scale(1.0));
  }
}

}  // namespace

OP_CASE("train (y, running and saved statistics), eval, backward (dx, dgamma, dbeta; in place dx == dy)",
        batchnorm_forward_train, batchnorm_forward_eval, batchnorm_backward) {
  std::mt19937 g(301);
  for (const BatchNormShape& s : kBnShapes) check_batchnorm(b, s, g);
}

// The GPU's ragged slices of the real shapes (bn2 at n = 128 and 88, bn1 at n = 88, tiny
// ones with a ragged slice): too slow for the cpu run, and the cpu has no slices.
CUDA_CASE("ragged slices of the real shapes within the derived bounds", batchnorm_forward_train,
          batchnorm_forward_eval, batchnorm_backward) {
  std::mt19937 g(250);
  for (const BatchNormShape& s : rb::ragged_shapes()) check_batchnorm(b, s, g);
}
