// Cases of the per-element and per-row ops: relu, maxpool, dropout, cross_entropy,
// softmax, reduce_sum, gather_batch, adam_update, digest_words, step_digest_finish, unscale_check.
#include <iterator>

#include "engine/kernels/philox.h"
#include "gpu/reduction_bounds.h"
#include "kernels/step_digest.h"
#include "ops/harness.h"

using namespace ops_test;

OP_CASE("bit for bit at ragged sizes, special values (signed zeros, NaN, inf, denormals), ties; in place",
        relu_forward, relu_backward) {
  std::mt19937 g(401);
  for (const int64_t n : {1, 7, 13, 4096, 4097, 70001, 100003}) {
    CAPTURE(n);
    auto x = n == 70001 ? quantised(static_cast<std::size_t>(n), g, 7) : uniform(static_cast<std::size_t>(n), g, -2.0f, 2.0f);
    auto dy = uniform(static_cast<std::size_t>(n), g, -2.0f, 2.0f);
    const float specials[] = {0.0f, -0.0f, kNaN, kInf, -kInf, 1e-40f, -1e-40f};
    for (std::size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];
    std::vector<float> y_ref(x.size()), dx_ref(x.size());
    ref::relu_forward(n, x.data(), y_ref.data());
    ref::relu_backward(n, y_ref.data(), dy.data(), dx_ref.data());
    std::size_t wrong = 0;  // the definition: x where x > 0, else 0 (NaN -> 0)
    for (std::size_t i = 0; i < x.size(); ++i) wrong += x[i] > 0.0f ? y_ref[i] != x[i] : y_ref[i] != 0.0f;
    CHECK(wrong == 0);
    Mem m(b);
    float *y = m.out<float>(x.size()), *dx = m.out<float>(x.size());
    const float *xd = m.in(x), *dyd = m.in(dy), *yr = m.in(y_ref);
    b.ops->relu_forward(n, xd, y);
    b.ops->relu_backward(n, yr, dyd, dx);
    check_bits("relu y", m.get(y), y_ref);
    check_bits("relu dx", m.get(dx), dx_ref);
    float* inplace = m.in(x);
    b.ops->relu_forward(n, inplace, inplace);
    check_bits("relu forward in place", m.get(inplace), y_ref);
    float* g2 = m.in(dy);
    b.ops->relu_backward(n, yr, g2, g2);
    check_bits("relu backward in place", m.get(g2), dx_ref);
  }
}

OP_CASE("values and argmax bit for bit: ties, NaN, inf, odd sizes", maxpool2x2_forward, maxpool2x2_backward) {
  std::mt19937 g(501);
  const PoolShape shapes[] = {{4, 32, 28, 28}, {4, 64, 14, 14}, {1, 1, 2, 2}, {3, 5, 6, 4}, {13, 2, 2, 6},
                              {2, 3, 7, 5},    {1, 2, 5, 9},    // odd: a last row or column no window reads
                              {2, 3, 28, 28},  {4, 16, 14, 14}, {3, 2, 6, 10}};
  int t_shape = 0;
  for (const PoolShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.h);
    CAPTURE(s.w);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w,
                      ny = static_cast<std::size_t>(s.n) * s.c * (s.h / 2) * (s.w / 2);
    // Every other shape: values from a small set (many ties); else ties copied in.
    auto x = (t_shape++ % 2) ? quantised(nx, g, 3) : uniform(nx, g, -1.0f, 1.0f);
    std::uniform_int_distribution<std::size_t> pick(0, nx - 1);
    for (std::size_t t = 0; t < nx / 8 + 1; ++t) {
      const std::size_t j = pick(g);
      const std::size_t top = (j / (2 * s.w)) * (2 * s.w) + (j % s.w) / 2 * 2;  // window's (0,0)
      const std::size_t cands[4] = {top, top + 1, top + s.w, top + s.w + 1};
      if (cands[3] < nx) x[cands[t % 4]] = x[cands[(t + 1 + t / 4) % 4]];
    }
    for (std::size_t t = 0; t < nx / 50 + 1; ++t) x[pick(g)] = (t % 3 == 0) ? kNaN : (t % 3 == 1 ? kInf : -kInf);
    std::vector<float> y_ref(ny);
    std::vector<int32_t> am_ref(ny);
    ref::maxpool2x2_forward(s, x.data(), y_ref.data(), am_ref.data());
    // The argmax points into the right window at the value returned.
    const int oh_n = s.h / 2, ow_n = s.w / 2;
    std::size_t wrong = 0;
    for (std::size_t o = 0; o < ny; ++o) {
      const int nc = static_cast<int>(o / (oh_n * ow_n)), oh = static_cast<int>(o / ow_n % oh_n),
                ow = static_cast<int>(o % ow_n);
      const int a = am_ref[o];
      const int ih = a / s.w % s.h, iw = a % s.w;
      wrong += a / (s.h * s.w) != nc || ih / 2 != oh || iw / 2 != ow || std::memcmp(&x[a], &y_ref[o], sizeof(float)) != 0;
    }
    CHECK(wrong == 0);
    const auto dy = uniform(ny, g, -1.0f, 1.0f);
    std::vector<float> dx_ref(nx);
    ref::maxpool2x2_backward(s, dy.data(), am_ref.data(), dx_ref.data());

    Mem m(b);
    float* y = m.out<float>(ny);
    int32_t* am = m.out<int32_t>(ny);
    b.ops->maxpool2x2_forward(s, m.in(x), y, am);
    check_bits("maxpool y", m.get(y), y_ref);
    check_bits("maxpool argmax", m.get(am), am_ref);
    float* dx = m.out<float>(nx);
    b.ops->maxpool2x2_backward(s, m.in(dy), m.in(am_ref), dx);
    check_bits("maxpool dx", m.get(dx), dx_ref);
  }
}

OP_CASE("PyTorch's tie and NaN rule, by hand", maxpool2x2_forward) {
  const PoolShape s{1, 1, 2, 4};
  // Window 0: {1, 3 / 3, 2} -> first 3 (index 1). Window 1: {NaN, 5 / 9, NaN} -> first NaN.
  const std::vector<float> x = {1.0f, 3.0f, kNaN, 5.0f, 3.0f, 2.0f, 9.0f, kNaN};
  std::vector<float> yr(2);
  std::vector<int32_t> amr(2);
  ref::maxpool2x2_forward(s, x.data(), yr.data(), amr.data());
  Mem m(b);
  float* yd = m.out<float>(2);
  int32_t* amd = m.out<int32_t>(2);
  b.ops->maxpool2x2_forward(s, m.in(x), yd, amd);
  for (const bool fast : {false, true}) {
    CAPTURE(fast);
    const std::vector<float> y = fast ? m.get(yd) : yr;
    const std::vector<int32_t> am = fast ? m.get(amd) : amr;
    CHECK(y[0] == 3.0f);
    CHECK(am[0] == 1);
    CHECK(std::isnan(y[1]));
    CHECK(am[1] == 7);  // NaN at the last position replaces the first NaN (NaN "moves on")
  }
}

OP_CASE("masks from Philox bit for bit, every p and offset", dropout_forward, dropout_backward) {
  std::mt19937 g(601);
  for (const uint64_t seed : {uint64_t{0x0123456789abcdefull}, uint64_t{0x5eedull}})
    for (const int64_t n : {1, 13, 1000, 4099, 10007, 100003})
      for (const float p : {0.0f, 0.25f, 0.5f, 0.9f, 1.0f})
        for (const uint64_t offset : {uint64_t{0}, uint64_t{3}, uint64_t{12345}, (uint64_t{1} << 33) + 5}) {
          if (seed == 0x5eedull && n != 10007) continue;  // the second stream at one size
          const PhiloxStream stream{seed + (seed == 0x5eedull ? offset : 0), 3};
          CAPTURE(n);
          CAPTURE(p);
          CAPTURE(offset);
          const auto x = uniform(static_cast<std::size_t>(n), g, -2.0f, 2.0f);
          std::vector<float> y_ref(x.size());
          std::vector<uint8_t> k_ref(x.size());
          // The counter (in memory) and the call's own offset add up: the whole offset
          // split two ways gives the same bits.
          const uint64_t counter = offset / 3, zero = 0;
          ref::dropout_forward(n, x.data(), p, stream, &zero, offset, y_ref.data(), k_ref.data());
          Mem m(b);
          float* y = m.out<float>(x.size());
          uint8_t* k = m.out<uint8_t>(x.size());
          b.ops->dropout_forward(n, m.in(x), p, stream, m.value(counter), offset - counter, y, k);
          check_bits("dropout keep", m.get(k), k_ref);
          check_bits("dropout y", m.get(y), y_ref);
          // The documented rule, independent of both backends.
          const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
          int64_t kept = 0, wrong = 0;
          for (int64_t i = 0; i < n; ++i) {
            const bool keep = engine::philox_uniform(engine::philox_at(stream, offset + static_cast<uint64_t>(i))) >= p;
            wrong += k_ref[i] != (keep ? 1 : 0);
            wrong += y_ref[i] != (keep ? x[i] * scale : 0.0f);
            kept += keep;
          }
          CHECK(wrong == 0);
          if (p == 0.0f) CHECK(kept == n);
          if (p == 1.0f) CHECK(kept == 0);
          if (n >= 100000) {  // keep fraction within 6 standard deviations of 1 - p
            const double sd = std::sqrt(n * p * (1.0 - p));
            CHECK(std::fabs(kept - n * (1.0 - p)) <= 6.0 * sd + 1.0);
          }
          const auto dy = uniform(x.size(), g, -1.0f, 1.0f);
          std::vector<float> dx_ref(x.size());
          ref::dropout_backward(n, dy.data(), k_ref.data(), p, dx_ref.data());
          float* dx = m.out<float>(x.size());
          b.ops->dropout_backward(n, m.in(dy), m.in(k_ref), p, dx);
          check_bits("dropout dx", m.get(dx), dx_ref);
        }
}

namespace {
// cross_entropy on a backend against ref (both computing in double): the cpu within 4 u
// relative, cuda within rel 1e-5 (exp and log on the device).
void check_ce(const Backend& b, int n, int total, int classes, const std::vector<float>& z,
              const std::vector<int32_t>& labels, float scale, std::vector<float>* d_out = nullptr,
              std::vector<float>* l_out = nullptr, std::vector<float>* c_out = nullptr) {
  double zmax = 0.0;
  for (float v : z) zmax = std::max(zmax, static_cast<double>(std::fabs(v)));
  std::vector<float> l_ref(n), c_ref(n), d_ref(z.size());
  const int64_t zero = 0, first = 5;  // the backend writes from element `first`
  ref::cross_entropy(n, total, classes, z.data(), labels.data(), &scale, &zero, d_ref.data(), l_ref.data(),
                     c_ref.data());
  Mem m(b);
  const float* zd = m.in(z);
  const int32_t* ld = m.in(labels);
  const float* scale_d = m.value(scale);
  const int64_t* first_d = m.value(first);
  float *l = m.out<float>(n + first), *c = m.out<float>(n + first), *d = m.out<float>(z.size());
  b.ops->cross_entropy(n, total, classes, zd, ld, scale_d, first_d, d, l, c);
  const auto after_first = [&](const std::vector<float>& v) {
    const std::vector<float> before(v.begin(), v.begin() + first);
    check_bits("ce: the elements before first untouched", before, Mem::poison<float>(first));
    return std::vector<float>(v.begin() + first, v.end());
  };
  const auto lg = after_first(m.get(l)), cg = after_first(m.get(c)), dg = m.get(d);
  if (b.cuda) {
    check_rel("ce loss", lg, l_ref, 1e-5, 1e-6);
    check_rel("ce dlogits", dg, d_ref, 1e-5, 1e-6 * magnitude(d_ref));
  } else {
    check_close("ce loss", lg, l_ref, [&](std::size_t i) { return 4.0 * kU * (std::fabs(l_ref[i]) + zmax) + 1e-30; });
    check_close("ce dlogits", dg, d_ref,
                [&](std::size_t i) { return 4.0 * kU * std::fabs(d_ref[i]) + 1e-7 * scale / total; });
  }
  check_bits("ce correct", cg, c_ref);
  // dlogits null: the per-sample outputs do not change.
  float *l2 = m.out<float>(n + first), *c2 = m.out<float>(n + first);
  b.ops->cross_entropy(n, total, classes, zd, ld, nullptr, first_d, nullptr, l2, c2);
  check_bits("ce loss with dlogits null", after_first(m.get(l2)), lg);
  check_bits("ce correct with dlogits null", after_first(m.get(c2)), cg);
  if (d_out) *d_out = dg;
  if (l_out) *l_out = l_ref;
  if (c_out) *c_out = c_ref;
}
}  // namespace

OP_CASE("loss, correct, dlogits; ties (first maximum wins); grad_scale 1, 1024, 65536; dlogits null",
        cross_entropy) {
  std::mt19937 g(701);
  struct Case {
    int n, classes;
    float spread;
  };
  const Case cases[] = {{1, 10, 3.0f}, {3, 10, 3.0f}, {13, 10, 10.0f}, {64, 10, 3.0f}, {5, 3, 100.0f},
                        {4, 1, 1.0f},  {37, 10, 5.0f}, {128, 10, 5.0f}, {5, 100, 5.0f}, {3, 1, 5.0f}};
  for (const Case& cs : cases) {
    CAPTURE(cs.n);
    CAPTURE(cs.classes);
    auto z = uniform(static_cast<std::size_t>(cs.n) * cs.classes, g, -cs.spread, cs.spread);
    std::uniform_int_distribution<int32_t> lab(0, cs.classes - 1);
    std::vector<int32_t> labels(cs.n);
    for (auto& l : labels) l = lab(g);
    if (cs.n >= 37) {  // every fourth row tied across a third of its classes
      for (int i = 4; i < cs.n; i += 4)
        for (int k = 0; k < cs.classes; ++k) z[static_cast<std::size_t>(i) * cs.classes + k] = (k % 3 == 1) ? 2.0f : -1.0f;
    }
    // Row 0: a tie between classes 1 and 2 for the maximum (first maximum wins).
    if (cs.classes >= 3) {
      z[1] = z[2] = cs.spread + 1.0f;
      labels[0] = cs.n > 1 ? 2 : 1;
    }
    for (const float scale : {1.0f, 1024.0f, 65536.0f}) {
      CAPTURE(scale);
      std::vector<float> d, l_ref, c_ref;
      check_ce(b, cs.n, cs.n, cs.classes, z, labels, scale, &d, &l_ref, &c_ref);
      std::vector<float> d_ref(z.size()), l3(cs.n), c3(cs.n), l4(cs.n), c4(cs.n);
      const int64_t zero = 0;
      ref::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), &scale, &zero, d_ref.data(), l4.data(),
                         c4.data());
      ref::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), nullptr, &zero, nullptr, l3.data(),
                         c3.data());
      check_bits("ref ce loss with dlogits null", l3, l_ref);
      check_bits("ref ce correct with dlogits null", c3, c_ref);
      // The definition, checked in long double on the reference.
      for (int i = 0; i < cs.n; ++i) {
        const float* zi = z.data() + static_cast<std::size_t>(i) * cs.classes;
        int arg = 0;
        for (int k = 1; k < cs.classes; ++k)
          if (zi[k] > zi[arg]) arg = k;
        long double sum = 0.0L;
        for (int k = 0; k < cs.classes; ++k) sum += std::exp(static_cast<long double>(zi[k]) - zi[arg]);
        const long double lse = zi[arg] + std::log(sum);
        CHECK(l_ref[i] == doctest::Approx(static_cast<double>(lse - zi[labels[i]])).epsilon(1e-6).scale(1.0));
        CHECK(c_ref[i] == (arg == labels[i] ? 1.0f : 0.0f));
        double row = 0.0;
        for (int k = 0; k < cs.classes; ++k) {
          const long double sm = std::exp(static_cast<long double>(zi[k]) - lse);
          const double want = static_cast<double>((sm - (k == labels[i] ? 1.0L : 0.0L)) * scale / cs.n);
          CHECK(d_ref[static_cast<std::size_t>(i) * cs.classes + k] ==
                doctest::Approx(want).epsilon(1e-6).scale(1e-7 * scale / cs.n));
          row += d_ref[static_cast<std::size_t>(i) * cs.classes + k];
        }
        CHECK(std::fabs(row) <= 1e-6 * scale / cs.n);  // softmax sums to one
      }
      if (cs.classes >= 3) CHECK(c_ref[0] == (labels[0] == 1 ? 1.0f : 0.0f));
    }
    // Scaling by a power of two is exact: dlogits(65536) == 65536 * dlogits(1), except
    // where dlogits(1) underflows into float denormals (softmax ~ e^-200 at spread 100).
    std::vector<float> d1, d2;
    check_ce(b, cs.n, cs.n, cs.classes, z, labels, 1.0f, &d1);
    check_ce(b, cs.n, cs.n, cs.classes, z, labels, 65536.0f, &d2);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < z.size(); ++i)
      wrong += std::fabs(d1[i]) >= std::numeric_limits<float>::min() && d2[i] != 65536.0f * d1[i];
    CHECK(wrong == 0);
  }
}

OP_CASE("a rank's part: the gradient of the mean over the whole batch (batch_total > n)", cross_entropy) {
  std::mt19937 g(14);
  for (const int total : {24}) {
    const int n = 5, classes = 10;
    const auto z = uniform(static_cast<std::size_t>(n) * classes, g, -4, 4);
    std::vector<int32_t> labels(n);
    for (int i = 0; i < n; ++i) labels[i] = static_cast<int32_t>(g() % classes);
    std::vector<float> d;
    check_ce(b, n, total, classes, z, labels, 2.0f, &d);
    // Against the definition: (softmax - onehot) * scale / total.
    for (int i = 0; i < n; ++i) {
      double zmax = z[i * classes], sum = 0;
      for (int k = 1; k < classes; ++k) zmax = std::max<double>(zmax, z[i * classes + k]);
      for (int k = 0; k < classes; ++k) sum += std::exp(z[i * classes + k] - zmax);
      for (int k = 0; k < classes; ++k) {
        const double want = (std::exp(z[i * classes + k] - zmax) / sum - (k == labels[i])) * 2.0 / total;
        CHECK(std::fabs(d[i * classes + k] - want) <= (b.cuda ? 1e-5 : 8 * kU) * std::fabs(want) + 1e-12);
      }
    }
    // The CUDA harness's case: 6 samples of 24, labels (7 i) mod 10.
    const auto z6 = uniform(static_cast<std::size_t>(6) * classes, g, -3.0f, 3.0f);
    std::vector<int32_t> l6(6);
    for (int i = 0; i < 6; ++i) l6[i] = (i * 7) % classes;
    check_ce(b, 6, total, classes, z6, l6, 2.0f);
  }
}

OP_CASE("NaN logits follow the reference's argmax rule", cross_entropy) {
  // The reference starts at class 0 and moves on only to a strictly greater value: a NaN
  // is the prediction only when it is class 0. 40 classes so lanes hold two values each.
  const int classes = 40, n = 6;
  std::mt19937 rng(650);
  auto logits = uniform(static_cast<std::size_t>(n) * classes, rng, -5.0f, 5.0f);
  auto at = [&](int i, int k) -> float& { return logits[static_cast<std::size_t>(i) * classes + k]; };
  at(0, 0) = kNaN;                                     // NaN first: class 0 is the prediction
  at(1, 1) = kNaN, at(1, 7) = 9.0f;                    // NaN in lane 1, maximum in another odd lane
  at(2, 33) = kNaN, at(2, 3) = 9.0f;                   // NaN in a lane's second value
  for (int k = 0; k < classes; ++k) at(3, k) = kNaN;   // all NaN
  at(4, 5) = kNaN, at(4, 2) = 8.0f, at(4, 18) = 8.0f;  // tie behind a NaN: first wins
  const std::vector<int32_t> labels = {0, 7, 3, 0, 2, 11};
  std::vector<float> dl_ref(logits.size()), loss_ref(n), corr_ref(n);
  const float one = 1.0f;
  const int64_t zero = 0;
  ref::cross_entropy(n, n, classes, logits.data(), labels.data(), &one, &zero, dl_ref.data(), loss_ref.data(),
                     corr_ref.data());
  Mem m(b);
  float *dl = m.out<float>(logits.size()), *loss = m.out<float>(n), *corr = m.out<float>(n);
  b.ops->cross_entropy(n, n, classes, m.in(logits), m.in(labels), m.value(one), m.value(zero), dl, loss, corr);
  check_bits("cross_entropy NaN rows: correct", m.get(corr), corr_ref);
  check_rel("cross_entropy NaN rows: loss", m.get(loss), loss_ref, 1e-5, 1e-6);
  check_rel("cross_entropy NaN rows: dlogits", m.get(dl), dl_ref, 1e-5, 1e-6);
}

// Both compute in double and round each probability to float once; their exponentials
// differ (each within about 1 ulp of double), so the floats may differ by one float ulp.
OP_CASE("within one float ulp; rows sum to 1; no overflow; -inf and all-equal rows", softmax) {
  std::mt19937 g(790);
  for (const int classes : {1, 2, 10, 33}) {
    for (const int n : {0, 1, 7, 1000, 4099}) {
      CAPTURE(classes);
      CAPTURE(n);
      auto z = uniform(static_cast<std::size_t>(n) * classes, g, -30.0f, 30.0f);
      if (n >= 7 && classes >= 2) {
        z[0] = 1e30f;                                                                            // huge
        z[static_cast<std::size_t>(classes)] = -kInf;                                            // row 1
        for (int k = 0; k < classes; ++k) z[2 * static_cast<std::size_t>(classes) + k] = 3.5f;  // all equal
      }
      std::vector<float> p_ref(z.size());
      ref::softmax(n, classes, z.data(), p_ref.data());
      Mem m(b);
      float* pd = m.out<float>(z.size());
      b.ops->softmax(n, classes, m.in(z), pd);
      const auto p = m.get(pd);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        const float ulp = std::nextafter(p_ref[i], kInf) - p_ref[i];
        bad += !(std::fabs(p[i] - p_ref[i]) <= ulp);
      }
      CHECK(bad == 0);
      for (int i = 0; i < n; ++i) {
        double sum = 0;
        for (int k = 0; k < classes; ++k) sum += p[static_cast<std::size_t>(i) * classes + k];
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
      }
      if (n >= 7 && classes >= 2) {
        CHECK(p[0] == 1.0f);
        CHECK(p[static_cast<std::size_t>(classes)] == 0.0f);
        CHECK(p[2 * static_cast<std::size_t>(classes)] == 1.0f / static_cast<float>(classes));
      }
    }
  }
}

OP_CASE("ragged sizes; deterministic; small integers exactly; n = 0", reduce_sum) {
  std::mt19937 g(801);
  for (const int64_t n : {0, 1, 13, 255, 256, 1000, 4097, 100003, 262145, 1000003, 1 << 20}) {
    CAPTURE(n);
    const auto x = uniform(static_cast<std::size_t>(n), g, -1.0f, 1.0f);
    double abs_sum = 0.0;
    for (float v : x) abs_sum += std::fabs(v);
    const double r = ref::reduce_sum(n, x.data());
    Mem m(b);
    const float* xd = m.in(x);
    const double c = b.ops->reduce_sum(n, xd);
    // Both sum the same doubles in different orders: within 2 gamma(n - 1) sum |x| on
    // cuda (reduction_bounds.h), 1e-12 of it on the cpu.
    const double bound = b.cuda ? reduction_bounds::order_difference(n, abs_sum) : 1e-12 * abs_sum;
    CHECK(std::fabs(r - c) <= bound);
    const double again = b.ops->reduce_sum(n, xd);
    CHECK(std::memcmp(&c, &again, sizeof(double)) == 0);
  }
  // Small integers sum exactly.
  std::vector<float> ints(10001);
  for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  double want = 0.0;
  for (float v : ints) want += v;
  Mem m(b);
  CHECK(b.ops->reduce_sum(static_cast<int64_t>(ints.size()), m.in(ints)) == want);
  CHECK(ref::reduce_sum(static_cast<int64_t>(ints.size()), ints.data()) == want);
}

OP_CASE("bit for bit: bytes 0 and 255, repeated indices, the definition", gather_batch) {
  std::mt19937 g(901);
  for (const int pixels : {784, 5})
    for (const int n : {1, 3, 13, 32, 64}) {
      CAPTURE(pixels);
      CAPTURE(n);
      const int images_n = 50;
      std::uniform_int_distribution<int> byte(0, 255), idx(0, images_n - 1);
      std::vector<uint8_t> images(static_cast<std::size_t>(images_n) * pixels), labels(images_n);
      for (auto& v : images) v = static_cast<uint8_t>(byte(g));
      for (auto& l : labels) l = static_cast<uint8_t>(byte(g) % 10);
      images[0] = 0;
      images[1] = 255;
      std::vector<int32_t> indices(n);
      for (auto& i : indices) i = idx(g);
      indices[0] = 0;                      // the image with the 0 and 255 bytes
      if (n > 2) indices[2] = indices[1];  // a repeated index
      const float mean = 0.2860f, std = 0.3530f;
      std::vector<float> out_ref(static_cast<std::size_t>(n) * pixels);
      std::vector<int32_t> lab_ref(n);
      const int64_t zero = 0;
      ref::gather_batch(n, pixels, images.data(), labels.data(), indices.data(), &zero, mean, std, out_ref.data(),
                        lab_ref.data());
      // The backend reads the same indices after 7 others, from first = 7.
      std::vector<int32_t> shifted(7, images_n - 1);
      shifted.insert(shifted.end(), indices.begin(), indices.end());
      const int64_t first = 7;
      Mem m(b);
      float* out = m.out<float>(out_ref.size());
      int32_t* lab = m.out<int32_t>(n);
      b.ops->gather_batch(n, pixels, m.in(images), m.in(labels), m.in(shifted), m.value(first), mean, std, out, lab);
      check_bits("gather out", m.get(out), out_ref);
      check_bits("gather labels", m.get(lab), lab_ref);
      int wrong = 0;  // the definition: (byte / 255 - mean) / std, to float accuracy
      for (int i = 0; i < n; ++i) {
        CHECK(lab_ref[i] == labels[indices[i]]);
        for (int p = 0; p < pixels; ++p) {
          const double want = (images[static_cast<std::size_t>(indices[i]) * pixels + p] / 255.0 - mean) / std;
          wrong += !(std::fabs(out_ref[static_cast<std::size_t>(i) * pixels + p] - want) <= 1e-6 * (1.0 + std::fabs(want)));
        }
      }
      CHECK(wrong == 0);
    }
}

OP_CASE("bit for bit over three steps: decoupled and L2 decay, zero and tiny gradients, moments", adam_update) {
  std::mt19937 g(1001);
  for (const int64_t n : {1, 13, 4096, 4097, 4099, 20011})
    for (const WeightDecayMode mode : {WeightDecayMode::Decoupled, WeightDecayMode::L2})
      for (const float wd : {0.0f, 0.01f, 0.05f}) {
        CAPTURE(n);
        CAPTURE(static_cast<int>(mode));
        CAPTURE(wd);
        AdamHyper h;
        h.lr = 3e-3f;
        h.beta1 = 0.9f;
        h.beta2 = 0.999f;
        h.eps = 1e-8f;
        h.weight_decay = wd;
        h.decay = mode;
        auto p_ref = uniform(static_cast<std::size_t>(n), g, -1.0f, 1.0f);
        // Moments from zero (the first steps) or from random values (a later step).
        const bool warm = n == 4099;
        std::vector<float> m_ref = warm ? uniform(p_ref.size(), g, -0.1f, 0.1f) : std::vector<float>(p_ref.size(), 0.0f);
        std::vector<float> v_ref = warm ? uniform(p_ref.size(), g, 0.0f, 0.01f) : std::vector<float>(p_ref.size(), 0.0f);
        Mem m(b);
        float *p = m.in(p_ref), *md = m.in(m_ref), *vd = m.in(v_ref);
        for (int t = 1; t <= 3; ++t) {
          auto grad = uniform(p_ref.size(), g, -0.1f, 0.1f);
          grad[0] = 0.0f;
          if (grad.size() > 1) grad[1] = 1e-30f;
          AdamStepFactors f{};
          f.step_size = static_cast<float>(h.lr / (1.0 - std::pow(0.9, t)));
          f.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
          f.decay_factor = static_cast<float>(1.0 - 3e-3 * wd);
          f.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
          f.one_minus_beta2 = static_cast<float>(1.0 - 0.999);
          // The reference's digests of the tensor at index `first` (a shard's offset), added
          // to a sum that already holds something: the op adds, never overwrites.
          const int64_t first = t == 3 ? 7919 : 0;
          const std::vector<uint64_t> held = {11, 22, 33};
          std::vector<uint64_t> want_sums = held;
          ref::adam_update(n, p_ref.data(), grad.data(), m_ref.data(), v_ref.data(), h, &f, nullptr, first,
                           want_sums.data());
          // A skip flag of 0 updates; of 1 (the loss scaler found an overflow) leaves all alone.
          const float* grad_d = m.in(grad);
          uint64_t* sums = m.in(held);
          b.ops->adam_update(n, p, grad_d, md, vd, h, m.value(f), t == 2 ? m.value(int32_t{0}) : nullptr, first,
                             sums);
          check_bits("adam param", m.get(p), p_ref);
          check_bits("adam exp_avg", m.get(md), m_ref);
          check_bits("adam exp_avg_sq", m.get(vd), v_ref);
          check_bits("adam digests", m.get(sums), want_sums);
          // Split in two at an odd point, with each part's index: the same sums (what
          // lets a rank's shard and a thread's block add their parts).
          std::vector<uint64_t> split_sums = held;
          const int64_t cut = n / 3;
          std::vector<float> p_copy = p_ref, m_copy = m_ref, v_copy = v_ref;
          const int32_t skip_all = 1;
          ref::adam_update(cut, p_copy.data(), grad.data(), m_copy.data(), v_copy.data(), h, &f, &skip_all, first,
                           split_sums.data());
          ref::adam_update(n - cut, p_copy.data() + cut, grad.data() + cut, m_copy.data() + cut, v_copy.data() + cut,
                           h, &f, &skip_all, first + cut, split_sums.data());
          CHECK(split_sums == want_sums);
          uint64_t* skipped_sums = m.in(held);
          b.ops->adam_update(n, p, grad_d, md, vd, h, m.value(f), m.value(int32_t{1}), first, skipped_sums);
          check_bits("adam param, skipped", m.get(p), p_ref);
          check_bits("adam exp_avg, skipped", m.get(md), m_ref);
          check_bits("adam exp_avg_sq, skipped", m.get(vd), v_ref);
          check_bits("adam digests, skipped (of the unchanged elements)", m.get(skipped_sums), want_sums);
          // No digests asked: none written.
          b.ops->adam_update(n, p, grad_d, md, vd, h, m.value(f), m.value(int32_t{1}), first, nullptr);
        }
      }
}

OP_CASE("the reference's digest, added to what the sum holds, at any length and index; one changed bit changes it",
        digest_words) {
  std::mt19937 g(1051);
  for (const int64_t n : {0, 1, 7, 8, 9, 4096, 65537, 300001})
    for (const int64_t first : {int64_t{0}, int64_t{5}, int64_t{1} << 33}) {
      CAPTURE(n);
      CAPTURE(first);
      std::vector<uint32_t> words(static_cast<std::size_t>(n));
      for (uint32_t& w : words) w = static_cast<uint32_t>(g());
      // The definition, summed from the last word down (the order must not matter).
      uint64_t want = 1234;
      for (int64_t i = n - 1; i >= 0; --i)
        want += engine::kernels::digest_term(static_cast<uint64_t>(first + i), words[static_cast<std::size_t>(i)]);
      Mem m(b);
      uint64_t* sum = m.in(std::vector<uint64_t>{1234});
      b.ops->digest_words(n, m.in(words), first, sum);
      check_bits("digest", m.get(sum), std::vector<uint64_t>{want});
      if (n == 0) continue;
      words[static_cast<std::size_t>(n / 2)] ^= 1u << 17;
      uint64_t* flipped = m.in(std::vector<uint64_t>{1234});
      b.ops->digest_words(n, m.in(words), first, flipped);
      CHECK(m.get(flipped)[0] != want);
    }
}

OP_CASE("the step's row of the ring: the sums moved (then zero), each range's and the loss slice's digest; "
        "the row wraps and the counter counts",
        step_digest_finish) {
  std::mt19937 g(1061);
  const std::vector<uint64_t> sums_host = {0x1111, 0x2222, 0x3333, 0xdeadbeefcafef00dull, 5, 6};
  const std::vector<float> mean = uniform(32, g, -1.0f, 1.0f), var = uniform(64, g, 0.0f, 2.0f);
  const std::vector<float> loss = uniform(1000, g, 0.0f, 3.0f);
  for (const int64_t first : {int64_t{0}, int64_t{960}, int64_t{128}})
    for (const int count : {0, 40, 64}) {
      if (first + count > 1000) continue;
      CAPTURE(first);
      CAPTURE(count);
      Mem m(b);
      uint64_t* sums = m.in(sums_host);
      const std::vector<engine::kernels::DigestRange> ranges = {{m.in(mean), 32}, {m.in(var), 64}};
      const int capacity = 3, row = 6 + 2 + 1;
      uint64_t* ring = m.in(std::vector<uint64_t>(static_cast<std::size_t>(capacity * row), 7));
      int64_t* next = m.in(std::vector<int64_t>{4});  // the fifth step: row 4 % 3 = 1
      b.ops->step_digest_finish(6, sums, 2, m.in(ranges), m.in(loss), m.value(first), count, ring, next, capacity);
      // The reference's row, from the definition.
      std::vector<uint64_t> want(static_cast<std::size_t>(capacity * row), 7);
      uint64_t* r = want.data() + row;
      for (int i = 0; i < 6; ++i) r[i] = sums_host[static_cast<std::size_t>(i)];
      r[6] = engine::kernels::digest_floats(mean.data(), 32, 0);
      r[7] = engine::kernels::digest_floats(var.data(), 64, 0);
      r[8] = engine::kernels::digest_floats(loss.data() + first, count, static_cast<uint64_t>(first));
      check_bits("ring", m.get(ring), want);
      check_bits("sums, zeroed", m.get(sums), std::vector<uint64_t>(6, 0));
      check_bits("next", m.get(next), std::vector<int64_t>{5});
    }
}

OP_CASE("scales bit for bit; found_inf set on inf/NaN (first, middle, last), never reset; overflow once unscaled",
        unscale_check) {
  std::mt19937 g(1101);
  for (const int64_t n : {1, 13, 5000, 100003}) {
    CAPTURE(n);
    const auto grad0 = uniform(static_cast<std::size_t>(n), g, -70000.0f, 70000.0f);
    const float inv_scale = 1.0f / 65536.0f;
    // Finite and infinite values bit for bit; on cuda a NaN only has to stay a NaN (its
    // sign and payload after the multiply are the hardware's choice, not the maths').
    auto run = [&](const std::vector<float>& in, float s, int32_t flag_in, std::vector<float>& out_ref,
                   int32_t& flag_ref, int32_t& flag_got) {
      out_ref = in;
      flag_ref = flag_in;
      ref::unscale_check(n, out_ref.data(), &s, &flag_ref);
      Mem m(b);
      float* gd = m.in(in);
      int32_t* fd = m.in(std::vector<int32_t>{flag_in});
      b.ops->unscale_check(n, gd, m.value(s), fd);
      const auto got = m.get(gd);
      if (b.cuda)
        check_close("unscaled grad", got, out_ref, [](std::size_t) { return 0.0; }, true);
      else
        check_bits("unscaled grad", got, out_ref);
      flag_got = m.get(fd)[0];
    };
    std::vector<float> a;
    int32_t fa = -1, fb = -1;
    run(grad0, inv_scale, 0, a, fa, fb);
    CHECK(fa == 0);
    CHECK(fb == 0);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < a.size(); ++i) wrong += a[i] != grad0[i] * inv_scale;
    CHECK(wrong == 0);
    run(grad0, inv_scale, 1, a, fa, fb);
    CHECK(fa == 1);
    CHECK(fb == 1);
    const std::size_t positions[] = {0, static_cast<std::size_t>(n / 2), static_cast<std::size_t>(n - 1)};
    for (const float bad : {kInf, kNaN, -kInf})
      for (const std::size_t pos : positions) {
        CAPTURE(bad);
        CAPTURE(pos);
        auto gr = grad0;
        gr[pos] = bad;
        run(gr, inv_scale, 0, a, fa, fb);
        CHECK(fa == 1);
        CHECK(fb == 1);
        run(gr, inv_scale, 1, a, fa, fb);
        CHECK(fa == 1);
        CHECK(fb == 1);
      }
    auto gr = grad0;
    gr[static_cast<std::size_t>(n - 1)] = 3e38f;  // finite, overflows once unscaled
    run(gr, 4.0f, 0, a, fa, fb);
    CHECK(fa == 1);
    CHECK(fb == 1);
    // The CUDA harness's scale (1/1024) with one inf and one NaN.
    auto g2 = grad0;
    g2[static_cast<std::size_t>(n / 3)] = kNaN;
    run(g2, 1.0f / 1024.0f, 0, a, fa, fb);
    CHECK(fa == 1);
    CHECK(fb == 1);
  }
}

OP_CASE("the step counts and factors on the device: counted unless skipped, the host's factors bit for bit",
        adam_prepare_step) {
  const AdamFactorInputs in{0.9, 0.999, 0.01};
  for (const double lr : {1e-3, 3.7e-4, 0.05}) {
    CAPTURE(lr);
    // Four tensors at different counts (a resumed run's may differ), from step 0 and far on.
    const std::vector<int64_t> start = {0, 1, 999, 123456};
    std::vector<int64_t> steps_ref = start;
    std::vector<AdamStepFactors> f_ref(start.size());
    const int32_t go = 0, skip = 1;
    Mem m(b);
    int64_t* steps = m.in(start);
    AdamStepFactors* f = m.out<AdamStepFactors>(start.size());
    for (int k = 0; k < 3; ++k) {
      ref::adam_prepare_step(4, &lr, in, &go, steps_ref.data(), f_ref.data());
      b.ops->adam_prepare_step(4, m.value(lr), in, m.value(go), steps, f);
      CHECK(m.get(steps) == steps_ref);
      const std::vector<AdamStepFactors> got = m.get(f);
      for (std::size_t i = 0; i < start.size(); ++i) {
        CHECK(steps_ref[i] == start[i] + k + 1);
        // The host's factors (what AdamOptimizer::prepare_step uploads), bit for bit.
        const AdamStepFactors want = adam_factors_at(lr, in, steps_ref[i]);
        CHECK(std::memcmp(&got[i], &want, sizeof want) == 0);
        CHECK(std::memcmp(&f_ref[i], &want, sizeof want) == 0);
      }
    }
    // Skipped: neither the counts nor the factors move.
    const std::vector<AdamStepFactors> before = m.get(f);
    b.ops->adam_prepare_step(4, m.value(lr), in, m.value(skip), steps, f);
    CHECK(m.get(steps) == steps_ref);
    const std::vector<AdamStepFactors> after = m.get(f);
    CHECK(std::memcmp(before.data(), after.data(), before.size() * sizeof(AdamStepFactors)) == 0);
  }
}

OP_CASE("GradScaler's rule: back off on overflow, grow at the interval unless infinite; flag cleared",
        loss_scale_update) {
  const LossScaleRule rule{2.0, 0.5, 3};
  // (found_inf per step) from scale 4: the expected scale and tracker after each step.
  struct Step {
    int32_t found;
    double scale;
    int64_t tracker;
  };
  const Step steps[] = {{0, 4, 1}, {0, 4, 2}, {0, 8, 0}, {1, 4, 0}, {0, 4, 1}, {1, 2, 0}, {0, 2, 1}};
  LossScaleState start;
  start.scale = 4.0;
  loss_scale_factors(start);
  LossScaleState ref_state = start;
  Mem m(b);
  LossScaleState* state = m.in(std::vector<LossScaleState>{start});
  for (const Step& st : steps) {
    ref_state.found_inf = st.found;
    LossScaleState set = m.get(state)[0];
    set.found_inf = st.found;
    m.put(state, std::vector<LossScaleState>{set});
    ref::loss_scale_update(&ref_state, rule);
    b.ops->loss_scale_update(state, rule);
    const LossScaleState got = m.get(state)[0];
    CHECK(got.scale == st.scale);
    CHECK(got.growth_tracker == st.tracker);
    CHECK(got.found_inf == 0);
    CHECK(got.scale_f32 == static_cast<float>(st.scale));
    CHECK(got.inv_scale_f32 == static_cast<float>(1.0 / st.scale));
    CHECK(std::memcmp(&got, &ref_state, sizeof got) == 0);
  }
  // Growth that would overflow to inf keeps the scale (and resets the tracker).
  LossScaleState big;
  big.scale = 1e308;
  big.growth_tracker = 2;
  LossScaleState* bd = m.in(std::vector<LossScaleState>{big});
  b.ops->loss_scale_update(bd, rule);
  CHECK(m.get(bd)[0].scale == 1e308);
  CHECK(m.get(bd)[0].growth_tracker == 0);
}

OP_CASE("bit for bit: nearest even, ties, overflow to inf, denormals, NaN, signed zeros", round_to_float) {
  std::mt19937_64 g(1201);
  std::vector<double> x = {0.0, -0.0, 1.0, -1.0, 1.0 + 0x1p-24, 1.0 + 0x1p-23 + 0x1p-24, 3.4028235677973366e38,
                           3.4028235677973366e38 * 1.0000001, -1e300, 1e-46, 1.4e-45, -7e-46, 1e-300,
                           std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  std::uniform_real_distribution<double> u(-1e4, 1e4);
  for (int i = 0; i < 5000; ++i) x.push_back(u(g));
  std::vector<float> y_ref(x.size());
  ref::round_to_float(static_cast<int64_t>(x.size()), x.data(), y_ref.data());
  const std::size_t nan_at = 14;
  REQUIRE(x[nan_at] != x[nan_at]);
  std::size_t wrong = 0;  // the definition: the C++ conversion, to nearest even
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(x[i]);
    if (i != nan_at) wrong += std::memcmp(&y_ref[i], &want, sizeof want) != 0;
  }
  CHECK(wrong == 0);
  Mem m(b);
  float* y = m.out<float>(x.size());
  b.ops->round_to_float(static_cast<int64_t>(x.size()), m.in(x), y);
  std::vector<float> got = m.get(y);
  // NaN stays NaN (its payload is the hardware's); everything else bit for bit.
  CHECK(got[nan_at] != got[nan_at]);
  got[nan_at] = y_ref[nan_at] = 0.0f;
  check_bits("rounded", got, y_ref);
}
