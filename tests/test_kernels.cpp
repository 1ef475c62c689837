// The fast CPU kernels (engine::kernels::cpu) against the reference kernels
// (engine::kernels::ref) for every op of kernels/op_signatures.inc, on random inputs
// over several shapes (the model's real layer shapes, batch 1/3/13, odd sizes, pad 0
// and non-square kernels), plus Philox known-answer tests and thread-count independence.
//
// Tolerances (u = 2^-24, the float32 unit roundoff):
//  - Exact ops (relu, maxpool values and argmax, dropout masks and outputs, gather_batch,
//    adam_update, unscale_check) must match bit for bit: both backends run the same
//    per-element function from kernels/elementwise.h or pure data movement.
//  - GEMM-based ops (conv, linear): the reference accumulates in double and rounds once;
//    the fast path sums in float. For an output that is a sum of T terms t_j, the
//    rounding errors of float summation form a random walk whose standard deviation is
//    ~0.4 * u * sqrt(T) * ||t||_2 (partial sums grow like sqrt(j) * rms(t)). We allow
//        u * |ref| + 16 * u * sqrt(T) * ||t||_2,
//    ~40 standard deviations, where ||t||_2^2 is computed exactly by running the
//    reference op on the squared inputs. A missing, duplicated or misplaced term moves
//    the output by ~||t||_2 / sqrt(T), which is 1 / (16 u T) >= 300x the tolerance for
//    every T used here (T <= 3137), so indexing bugs cannot hide inside it.
//  - Plain sums of T terms (conv/linear bias gradients, batchnorm statistics and
//    parameter gradients), which the fast path may accumulate in float lanes or in
//    double: one float ulp plus 16 * u * sqrt(T) * sum|t|. That is again ~40 standard
//    deviations of the float rounding walk, whether the terms have one sign (partial
//    sums grow like j: std ~0.33 u sqrt(T) sum|t|) or are zero-mean (smaller). It stays
//    below the smallest plausible bug, a 1/m vs 1/(m-1) normaliser (relative 1/T), for
//    every T used here: at T = 3136, 16 u sqrt(T) = 5.3e-5 against 1/T = 3.2e-4.
//    reduce_sum is specified as a double accumulation: 1e-12 of the sum of magnitudes.
//  - Batchnorm's fast path folds the normalisation into y = x * a + b in float: a few
//    roundings of |x a|, |mean a| and |beta| (8 u of their sum), plus the propagated
//    tolerances of its mean and 1/std. Its backward likewise for
//    k * (dy - mean_dy - (x - mean) * proj), with the sums' tolerances propagated.
//  - cross_entropy: both sides compute in double (the fast path keeps each exponential
//    and divides by the sum, the reference takes a second exp); we allow 4 u relative (plus
//    4 u of the largest |logit| for the loss, whose log-sum-exp is shifted by it).
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/kernels/philox.h"
#include "kernels/chunk_tree.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/bulk_copy.h"
#include "kernels/ops.h"
#include "support/random_data.h"

namespace {

namespace ref = engine::kernels::ref;
namespace cpu = engine::kernels::cpu;
using engine::PhiloxStream;
using engine::kernels::AdamHyper;
using engine::kernels::AdamStepFactors;
using engine::kernels::BatchNormShape;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;
using engine::kernels::PoolShape;
using engine::kernels::WeightDecayMode;

constexpr double kU = 1.0 / 16777216.0;  // 2^-24
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using test_support::uniform;

std::vector<float> squared(const std::vector<float>& v) {
  std::vector<float> s(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) s[i] = v[i] * v[i];
  return s;
}

// |got - want| <= tol(i) for every element; NaN anywhere fails. Reports the number of
// failures and the first one. With KERNEL_TEST_VERBOSE set, prints the largest
// |diff| / tol of every check (the margin left by each tolerance).
template <class Tol>
void check_close(const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& want, Tol tol) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  double first_tol = 0.0, worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    const double t = tol(i);
    if (!(err <= t)) {
      if (bad++ == 0) {
        first = i;
        first_tol = t;
      }
    } else if (t > 0) {
      worst_ratio = std::max(worst_ratio, err / t);
    }
  }
  if (std::getenv("KERNEL_TEST_VERBOSE"))
    MESSAGE(what << ": max |diff|/tol over passing elements " << worst_ratio);
  if (bad == 0) return;
  std::ostringstream o;
  o.precision(9);
  o << what << ": " << bad << " of " << got.size() << " elements outside tolerance; first at ["
    << first << "] got " << got[first] << " want " << want[first] << " |diff| "
    << std::fabs(static_cast<double>(got[first]) - want[first]) << " tol " << first_tol;
  FAIL_CHECK(o.str());
}

template <class T>
void check_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (bad++ == 0) first = i;
    }
  if (bad == 0) return;
  std::ostringstream o;
  o.precision(9);
  o << what << ": " << bad << " of " << got.size() << " elements differ bitwise; first at ["
    << first << "] got " << +got[first] << " want " << +want[first];
  FAIL_CHECK(o.str());
}

// Tolerance of a float sum of `terms` products against the double reference (see top).
double gemm_tol(double ref_value, double sum_sq, double terms) {
  return kU * std::fabs(ref_value) + 16.0 * kU * std::sqrt(terms) * std::sqrt(sum_sq) + 1e-30;
}
// Tolerance of a sum of `terms` values whose magnitudes add up to `sum_abs`, accumulated
// in float or double and rounded to float, against the double reference (see top).
double sum_tol(double ref_value, double sum_abs, double terms) {
  return 2.0 * kU * std::fabs(ref_value) + 16.0 * kU * std::sqrt(terms) * sum_abs + 1e-37;
}

std::string conv_name(const ConvShape& s) {
  std::ostringstream o;
  o << "conv N" << s.n << " C" << s.c << " " << s.h << "x" << s.w << " K" << s.k << " kernel "
    << s.r << "x" << s.s << " pad " << s.pad;
  return o.str();
}

const ConvShape kConvShapes[] = {
    {4, 1, 28, 28, 32, 3, 3, 1},   // conv1 of the model
    {4, 32, 14, 14, 64, 3, 3, 1},  // conv2 of the model
    {1, 3, 7, 9, 5, 2, 3, 0},      // batch 1, pad 0, non-square kernel
    {3, 2, 5, 6, 4, 3, 1, 2},      // batch 3, non-square kernel, pad wider than the kernel
    {13, 3, 6, 5, 7, 3, 3, 1},     // batch 13 (> the 8 batch chunks), odd sizes
    {9, 4, 1, 1, 2, 1, 1, 0},      // 1x1 image, 1x1 kernel
};

const LinearShape kLinearShapes[] = {
    {4, 3136, 128},  // fc1
    {4, 128, 10},    // fc2
    {1, 7, 3},       // batch 1
    {3, 5, 13},      // batch 3
    {13, 17, 9},     // batch 13
    {64, 128, 10},   // a training batch
};

}  // namespace

// ---------------------------------------------------------------------------------
// Philox4x32-10 (engine/kernels/philox.h)
// ---------------------------------------------------------------------------------
TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: ctr[4] key[2] -> out[4].
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    engine::Philox4x32 c{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}};
    const engine::Philox4x32 r = engine::philox4x32_10(c, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) CHECK(r.v[i] == k.out[i]);
  }
}

TEST_CASE("philox_at lays out the stream as cuRAND does") {
  // Value j of (seed, subsequence) is word j % 4 of
  // philox({j/4 lo, j/4 hi, subsequence lo, subsequence hi}, {seed lo, seed hi}).
  const PhiloxStream streams[] = {{0, 0}, {42, 3}, {0x0123456789abcdefull, 0xfedcba9876543210ull}};
  const uint64_t positions[] = {0, 1, 2, 3, 4, 5, 7, 1000001, (1ull << 34) + 2, ~0ull};
  for (const PhiloxStream& s : streams)
    for (const uint64_t j : positions) {
      const uint64_t block = j / 4;
      engine::Philox4x32 c{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                            static_cast<uint32_t>(s.subsequence),
                            static_cast<uint32_t>(s.subsequence >> 32)}};
      const engine::Philox4x32 r = engine::philox4x32_10(c, static_cast<uint32_t>(s.seed),
                                                         static_cast<uint32_t>(s.seed >> 32));
      CHECK(engine::philox_at(s, j) == r.v[j % 4]);
    }
  // The first four outputs of (seed 0, subsequence 0) are the first KAT vector.
  CHECK(engine::philox_at({0, 0}, 0) == 0x6627e8d5u);
  CHECK(engine::philox_at({0, 0}, 3) == 0x9b00dbd8u);
}

TEST_CASE("philox_uniform gives 24-bit floats in [0, 1)") {
  CHECK(engine::philox_uniform(0u) == 0.0f);
  CHECK(engine::philox_uniform(0xffu) == 0.0f);  // the low 8 bits are dropped
  CHECK(engine::philox_uniform(0x100u) == 1.0f / 16777216.0f);
  CHECK(engine::philox_uniform(0xffffffffu) == 16777215.0f / 16777216.0f);
  CHECK(engine::philox_uniform(0xffffffffu) < 1.0f);
  CHECK(engine::philox_uniform(0x80000000u) == 0.5f);
}

// ---------------------------------------------------------------------------------
// Convolution
// ---------------------------------------------------------------------------------
TEST_CASE("ref conv2d is a zero-padded cross-correlation in NCHW/OIHW layout") {
  // 1 image, 1 channel, 2x3 input, 2x2 kernel, pad 1 -> 3x4 output.
  const ConvShape s{1, 1, 2, 3, 2, 2, 2, 1};
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> w = {1, 10, 100, 1000, /* second output channel */ 0, 0, 0, 1};
  const std::vector<float> b = {0.5f, -1.0f};
  std::vector<float> y(2 * 3 * 4);
  ref::conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
  // y[k, oh, ow] = b[k] + sum_{r,q} x[oh + r - 1, ow + q - 1] * w[k, r, q]
  const std::vector<float> want = {
      1000.5f, 2100.5f, 3200.5f, 300.5f,  // oh = 0: only the kernel's bottom row reads x
      4010.5f, 5421.5f, 6532.5f, 603.5f,  // oh = 1
      40.5f,   54.5f,   65.5f,   6.5f,    // oh = 2: only the top row
      0.0f,    1.0f,    2.0f,    -1.0f,   // channel 1 reads x[oh, ow] (w[1,1,1] = 1)
      3.0f,    4.0f,    5.0f,    -1.0f,  -1.0f, -1.0f, -1.0f, -1.0f};
  check_bits("hand-computed conv", y, want);
}

TEST_CASE("cpu conv2d_forward matches ref") {
  std::mt19937 g(101);
  for (const ConvShape& s : kConvShapes) {
    CAPTURE(conv_name(s));
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.c * s.r * s.s));
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.c * s.h * s.w, g, -1.0f, 1.0f);
    const auto w = uniform(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, g, -bound, bound);
    const auto b = uniform(static_cast<std::size_t>(s.k), g, -bound, bound);
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const double terms = s.c * s.r * s.s + 1;
    for (const bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      const float* bp = with_bias ? b.data() : nullptr;
      std::vector<float> y_ref(ny), y_cpu(ny, kNaN), y_sq(ny);
      ref::conv2d_forward(s, x.data(), w.data(), bp, y_ref.data());
      cpu::conv2d_forward(s, x.data(), w.data(), bp, y_cpu.data());
      const auto b2 = squared(b);
      ref::conv2d_forward(s, squared(x).data(), squared(w).data(), with_bias ? b2.data() : nullptr,
                          y_sq.data());
      check_close("conv y", y_cpu, y_ref,
                  [&](std::size_t i) { return gemm_tol(y_ref[i], y_sq[i], terms); });
    }
  }
}

TEST_CASE("cpu conv2d_backward matches ref (dx, dw, db; dx and db null)") {
  std::mt19937 g(102);
  for (const ConvShape& s : kConvShapes) {
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
    ref::conv2d_backward(s, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    // Sums of squared terms for the tolerances, and sum |dy| per channel.
    std::vector<float> dx_sq(nx), dw_sq(nw), db_sq(s.k);
    ref::conv2d_backward(s, squared(x).data(), squared(w).data(), squared(dy).data(), dx_sq.data(),
                         dw_sq.data(), db_sq.data());
    std::vector<double> dy_abs(s.k, 0.0);
    for (int n = 0; n < s.n; ++n)
      for (int k = 0; k < s.k; ++k)
        for (int i = 0; i < ohw; ++i) dy_abs[k] += std::fabs(dy[(static_cast<std::size_t>(n) * s.k + k) * ohw + i]);

    // Outputs pre-filled with NaN: backward ops overwrite, never accumulate.
    std::vector<float> dx(nx, kNaN), dw(nw, kNaN), db(s.k, kNaN);
    cpu::conv2d_backward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    check_close("conv dx", dx, dx_ref,
                [&](std::size_t i) { return gemm_tol(dx_ref[i], dx_sq[i], s.k * s.r * s.s); });
    check_close("conv dw", dw, dw_ref, [&](std::size_t i) {
      return gemm_tol(dw_ref[i], dw_sq[i], static_cast<double>(s.n) * ohw + engine::kTreeChunks);
    });
    check_close("conv db", db, db_ref, [&](std::size_t i) {
      return sum_tol(db_ref[i], dy_abs[i], static_cast<double>(s.n) * ohw);
    });

    // dx null (the first layer): dw and db unchanged, bit for bit.
    std::vector<float> dw2(nw, kNaN), db2(s.k, kNaN);
    cpu::conv2d_backward(s, x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data());
    check_bits("conv dw with dx null", dw2, dw);
    check_bits("conv db with dx null", db2, db);
    // db null as well (the reference defines it).
    std::vector<float> dw3(nw, kNaN), dx3(nx, kNaN);
    cpu::conv2d_backward(s, x.data(), w.data(), dy.data(), dx3.data(), dw3.data(), nullptr);
    check_bits("conv dw with db null", dw3, dw);
    check_bits("conv dx with db null", dx3, dx);
    std::vector<float> dw_ref2(nw, kNaN);
    ref::conv2d_backward(s, x.data(), w.data(), dy.data(), nullptr, dw_ref2.data(), nullptr);
    check_bits("ref conv dw with dx, db null", dw_ref2, dw_ref);
  }
}

// ---------------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------------
TEST_CASE("ref linear uses [out, in] weights") {
  const LinearShape s{2, 3, 2};
  const std::vector<float> x = {1, 2, 3, -1, 0, 1};
  const std::vector<float> w = {1, 10, 100, 0, 1, 0};
  const std::vector<float> b = {0.5f, 2.0f};
  std::vector<float> y(4);
  ref::linear_forward(s, x.data(), w.data(), b.data(), y.data());
  check_bits("hand-computed linear", y, std::vector<float>{321.5f, 4.0f, 99.5f, 2.0f});
}

TEST_CASE("cpu linear_forward matches ref") {
  std::mt19937 g(201);
  for (const LinearShape& s : kLinearShapes) {
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const float bound = 1.0f / std::sqrt(static_cast<float>(s.in));
    const auto x = uniform(static_cast<std::size_t>(s.n) * s.in, g, -1.0f, 1.0f);
    const auto w = uniform(static_cast<std::size_t>(s.out) * s.in, g, -bound, bound);
    const auto b = uniform(static_cast<std::size_t>(s.out), g, -bound, bound);
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.out;
    for (const bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      const float* bp = with_bias ? b.data() : nullptr;
      std::vector<float> y_ref(ny), y_cpu(ny, kNaN), y_sq(ny);
      ref::linear_forward(s, x.data(), w.data(), bp, y_ref.data());
      cpu::linear_forward(s, x.data(), w.data(), bp, y_cpu.data());
      const auto b2 = squared(b);
      ref::linear_forward(s, squared(x).data(), squared(w).data(), with_bias ? b2.data() : nullptr,
                          y_sq.data());
      check_close("linear y", y_cpu, y_ref,
                  [&](std::size_t i) { return gemm_tol(y_ref[i], y_sq[i], s.in + 1); });
    }
  }
}

TEST_CASE("cpu linear_backward matches ref (dx, dw, db; dx and db null)") {
  std::mt19937 g(202);
  for (const LinearShape& s : kLinearShapes) {
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
    ref::linear_backward(s, x.data(), w.data(), dy.data(), dx_ref.data(), dw_ref.data(),
                         db_ref.data());
    std::vector<float> dx_sq(nx), dw_sq(nw), db_sq(s.out);
    ref::linear_backward(s, squared(x).data(), squared(w).data(), squared(dy).data(), dx_sq.data(),
                         dw_sq.data(), db_sq.data());
    std::vector<double> dy_abs(s.out, 0.0);
    for (int n = 0; n < s.n; ++n)
      for (int o = 0; o < s.out; ++o) dy_abs[o] += std::fabs(dy[static_cast<std::size_t>(n) * s.out + o]);

    std::vector<float> dx(nx, kNaN), dw(nw, kNaN), db(s.out, kNaN);
    cpu::linear_backward(s, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data());
    check_close("linear dx", dx, dx_ref,
                [&](std::size_t i) { return gemm_tol(dx_ref[i], dx_sq[i], s.out); });
    check_close("linear dw", dw, dw_ref, [&](std::size_t i) {
      return gemm_tol(dw_ref[i], dw_sq[i], s.n + engine::kTreeChunks);
    });
    check_close("linear db", db, db_ref,
                [&](std::size_t i) { return sum_tol(db_ref[i], dy_abs[i], s.n); });

    std::vector<float> dw2(nw, kNaN), db2(s.out, kNaN);
    cpu::linear_backward(s, x.data(), w.data(), dy.data(), nullptr, dw2.data(), db2.data());
    check_bits("linear dw with dx null", dw2, dw);
    check_bits("linear db with dx null", db2, db);
    std::vector<float> dx3(nx, kNaN), dw3(nw, kNaN);
    cpu::linear_backward(s, x.data(), w.data(), dy.data(), dx3.data(), dw3.data(), nullptr);
    check_bits("linear dx with db null", dx3, dx);
    check_bits("linear dw with db null", dw3, dw);
    std::vector<float> dw_ref2(nw, kNaN);
    ref::linear_backward(s, x.data(), w.data(), dy.data(), nullptr, dw_ref2.data(), nullptr);
    check_bits("ref linear dw with dx, db null", dw_ref2, dw_ref);
  }
}

// ---------------------------------------------------------------------------------
// Batch normalisation
// ---------------------------------------------------------------------------------
namespace {

const BatchNormShape kBnShapes[] = {
    {4, 32, 784},  // bn1
    {4, 64, 196},  // bn2
    {1, 3, 5},     // batch 1
    {13, 5, 1},    // batch 13, 1x1 maps
    {3, 7, 4},     // batch 3
    {1, 3, 1},     // a single element per channel (variance 0)
};

// x[n, c, i] = mu_c + sigma_c * U(-1, 1): channels with different offsets and scales.
std::vector<float> bn_input(const BatchNormShape& s, std::mt19937& g) {
  std::uniform_real_distribution<float> mu(-3.0f, 3.0f), sigma(0.1f, 2.0f), u(-1.0f, 1.0f);
  std::vector<float> m(s.c), sd(s.c);
  for (int c = 0; c < s.c; ++c) {
    m[c] = mu(g);
    sd[c] = sigma(g);
  }
  std::vector<float> x(static_cast<std::size_t>(s.n) * s.c * s.hw);
  for (int n = 0; n < s.n; ++n)
    for (int c = 0; c < s.c; ++c)
      for (int i = 0; i < s.hw; ++i) x[(static_cast<std::size_t>(n) * s.c + c) * s.hw + i] = m[c] + sd[c] * u(g);
  return x;
}

std::string bn_name(const BatchNormShape& s) {
  std::ostringstream o;
  o << "bn N" << s.n << " C" << s.c << " HW" << s.hw;
  return o.str();
}

std::size_t bn_channel(const BatchNormShape& s, std::size_t j) {
  return (j / static_cast<std::size_t>(s.hw)) % static_cast<std::size_t>(s.c);
}

}  // namespace

TEST_CASE("cpu batchnorm_forward_train matches ref (y, running and saved statistics)") {
  std::mt19937 g(301);
  const float eps = 1e-5f, momentum = 0.1f;
  for (const BatchNormShape& s : kBnShapes) {
    CAPTURE(bn_name(s));
    const auto x = bn_input(s, g);
    const auto gamma = uniform(s.c, g, 0.5f, 1.5f);
    const auto beta = uniform(s.c, g, -1.0f, 1.0f);
    const auto rm0 = uniform(s.c, g, -1.0f, 1.0f);
    const auto rv0 = uniform(s.c, g, 0.5f, 2.0f);
    const std::size_t nx = x.size();

    std::vector<float> rm_ref = rm0, rv_ref = rv0, sm_ref(s.c), si_ref(s.c), y_ref(nx);
    ref::batchnorm_forward_train(s, x.data(), gamma.data(), beta.data(), eps, momentum,
                                 rm_ref.data(), rv_ref.data(), sm_ref.data(), si_ref.data(),
                                 y_ref.data());
    std::vector<float> rm = rm0, rv = rv0, sm(s.c, kNaN), si(s.c, kNaN), y(nx, kNaN);
    cpu::batchnorm_forward_train(s, x.data(), gamma.data(), beta.data(), eps, momentum, rm.data(),
                                 rv.data(), sm.data(), si.data(), y.data());

    // Statistics: the mean is a sum of m terms; 1/std comes from a sum of m squares
    // (relative error 16 u sqrt(m), halved by the square root, plus a few roundings).
    const double m = static_cast<double>(s.n) * s.hw;
    std::vector<double> x_abs(s.c, 0.0);
    for (std::size_t j = 0; j < nx; ++j) x_abs[bn_channel(s, j)] += std::fabs(x[j]);
    std::vector<double> tol_mean(s.c);
    for (int c = 0; c < s.c; ++c) tol_mean[c] = sum_tol(sm_ref[c], x_abs[c] / m, m);
    const double rel_invstd = 4.0 * kU + 16.0 * kU * std::sqrt(m);
    check_close("bn save_mean", sm, sm_ref, [&](std::size_t c) { return tol_mean[c]; });
    check_close("bn save_invstd", si, si_ref,
                [&](std::size_t c) { return rel_invstd * std::fabs(si_ref[c]); });
    check_close("bn running_mean", rm, rm_ref, [&](std::size_t c) {
      return tol_mean[c] + 2.0 * kU * (std::fabs(rm_ref[c]) + std::fabs(rm0[c]));
    });
    check_close("bn running_var", rv, rv_ref, [&](std::size_t c) {
      return 2.0 * rel_invstd * std::fabs(rv_ref[c]) + 2.0 * kU * (std::fabs(rv_ref[c]) + std::fabs(rv0[c]));
    });
    check_close("bn y", y, y_ref, [&](std::size_t j) {
      const std::size_t c = bn_channel(s, j);
      const double a = static_cast<double>(si_ref[c]) * gamma[c];
      return 8.0 * kU * (std::fabs(x[j] * a) + std::fabs(sm_ref[c] * a) + std::fabs(beta[c])) +
             std::fabs(a) * tol_mean[c] +
             std::fabs((static_cast<double>(x[j]) - sm_ref[c]) * a) * rel_invstd + 1e-30;
    });

    // The statistics themselves (independent of both backends): mean, biased variance
    // for the normalisation, unbiased for the running estimate.
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
}

TEST_CASE("cpu batchnorm_forward_eval matches ref") {
  std::mt19937 g(302);
  const float eps = 1e-5f;
  for (const BatchNormShape& s : kBnShapes) {
    CAPTURE(bn_name(s));
    const auto x = bn_input(s, g);
    const auto gamma = uniform(s.c, g, 0.5f, 1.5f);
    const auto beta = uniform(s.c, g, -1.0f, 1.0f);
    const auto rm = uniform(s.c, g, -3.0f, 3.0f);
    const auto rv = uniform(s.c, g, 0.01f, 4.0f);
    std::vector<float> y_ref(x.size()), y(x.size(), kNaN);
    ref::batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), eps,
                                y_ref.data());
    cpu::batchnorm_forward_eval(s, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), eps,
                                y.data());
    check_close("bn eval y", y, y_ref, [&](std::size_t j) {
      const std::size_t c = bn_channel(s, j);
      const double a = gamma[c] / std::sqrt(static_cast<double>(rv[c]) + eps);
      return 8.0 * kU * (std::fabs(x[j] * a) + std::fabs(rm[c] * a) + std::fabs(beta[c])) + 1e-30;
    });
  }
}

TEST_CASE("cpu batchnorm_backward matches ref (dx, dgamma, dbeta)") {
  std::mt19937 g(303);
  const float eps = 1e-5f;
  for (const BatchNormShape& s : kBnShapes) {
    CAPTURE(bn_name(s));
    const auto x = bn_input(s, g);
    const auto gamma = uniform(s.c, g, 0.5f, 1.5f);
    const auto beta = uniform(s.c, g, -1.0f, 1.0f);
    const auto dy = uniform(x.size(), g, -1.0f, 1.0f);
    std::vector<float> rm(s.c, 0.0f), rv(s.c, 1.0f), sm(s.c), si(s.c), y(x.size());
    ref::batchnorm_forward_train(s, x.data(), gamma.data(), beta.data(), eps, 0.1f, rm.data(),
                                 rv.data(), sm.data(), si.data(), y.data());
    std::vector<float> dx_ref(x.size()), dg_ref(s.c), db_ref(s.c);
    ref::batchnorm_backward(s, x.data(), dy.data(), gamma.data(), sm.data(), si.data(),
                            dx_ref.data(), dg_ref.data(), db_ref.data());
    std::vector<float> dx(x.size(), kNaN), dg(s.c, kNaN), db(s.c, kNaN);
    cpu::batchnorm_backward(s, x.data(), dy.data(), gamma.data(), sm.data(), si.data(), dx.data(),
                            dg.data(), db.data());

    // Per channel: sum dy, sum |dy|, sum dy*(x-mean), sum |dy*(x-mean)|.
    const double m = static_cast<double>(s.n) * s.hw;
    std::vector<double> sdy(s.c, 0.0), sady(s.c, 0.0), sdyxc(s.c, 0.0), sadyxc(s.c, 0.0);
    for (std::size_t j = 0; j < x.size(); ++j) {
      const std::size_t c = bn_channel(s, j);
      const double xc = static_cast<double>(x[j]) - sm[c];
      sdy[c] += dy[j];
      sady[c] += std::fabs(dy[j]);
      sdyxc[c] += dy[j] * xc;
      sadyxc[c] += std::fabs(dy[j] * xc);
    }
    // dx = k (dy - mean_dy - (x - mean) proj), k = gamma/std, proj = sum(dy (x-mean))/(m var):
    // roundings of each part, plus the sums' tolerances (sum_tol without its ulp term).
    const double sum_rel = 16.0 * kU * std::sqrt(m) + 4.0 * kU;
    check_close("bn dx", dx, dx_ref, [&](std::size_t j) {
      const std::size_t c = bn_channel(s, j);
      const double k = static_cast<double>(gamma[c]) * si[c];
      const double proj = sdyxc[c] * si[c] * si[c] / m;
      const double xc = std::fabs(static_cast<double>(x[j]) - sm[c]);
      const double err_mean_dy = sum_rel * sady[c] / m;
      const double err_proj = sum_rel * sadyxc[c] * si[c] * si[c] / m;
      return kU * std::fabs(dx_ref[j]) +
             std::fabs(k) * (8.0 * kU * (std::fabs(dy[j]) + std::fabs(sdy[c] / m) + xc * std::fabs(proj)) +
                             err_mean_dy + xc * err_proj) +
             1e-30;
    });
    check_close("bn dgamma", dg, dg_ref, [&](std::size_t c) {
      return 2.0 * kU * std::fabs(dg_ref[c]) + sum_rel * si[c] * sadyxc[c] + 1e-30;
    });
    check_close("bn dbeta", db, db_ref, [&](std::size_t c) { return sum_tol(db_ref[c], sady[c], m); });
  }
}

// ---------------------------------------------------------------------------------
// ReLU
// ---------------------------------------------------------------------------------
TEST_CASE("cpu relu forward/backward match ref bit for bit") {
  std::mt19937 g(401);
  for (const int64_t n : {1, 7, 13, 4096, 4097, 100003}) {
    CAPTURE(n);
    auto x = uniform(static_cast<std::size_t>(n), g, -2.0f, 2.0f);
    auto dy = uniform(static_cast<std::size_t>(n), g, -2.0f, 2.0f);
    // Special values at the front: signed zeros, NaN, infinities, a denormal.
    const float specials[] = {0.0f, -0.0f, kNaN, kInf, -kInf, 1e-40f, -1e-40f};
    for (std::size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];
    std::vector<float> y_ref(x.size()), y(x.size(), kNaN);
    ref::relu_forward(n, x.data(), y_ref.data());
    cpu::relu_forward(n, x.data(), y.data());
    check_bits("relu y", y, y_ref);
    std::size_t wrong = 0;  // the definition: x where x > 0, else 0 (NaN -> 0)
    for (std::size_t i = 0; i < x.size(); ++i) wrong += x[i] > 0.0f ? y_ref[i] != x[i] : y_ref[i] != 0.0f;
    CHECK(wrong == 0);

    std::vector<float> dx_ref(x.size()), dx(x.size(), kNaN);
    ref::relu_backward(n, y_ref.data(), dy.data(), dx_ref.data());
    cpu::relu_backward(n, y_ref.data(), dy.data(), dx.data());
    check_bits("relu dx", dx, dx_ref);
  }
}

// ---------------------------------------------------------------------------------
// Max pooling
// ---------------------------------------------------------------------------------
TEST_CASE("cpu maxpool2x2 forward/backward match ref (values and argmax bit for bit)") {
  std::mt19937 g(501);
  const PoolShape shapes[] = {{4, 32, 28, 28}, {4, 64, 14, 14}, {1, 1, 2, 2}, {3, 5, 6, 4},
                              {13, 2, 2, 6}, {2, 3, 7, 5}, {1, 2, 5, 9}};  // odd: a last row or column no window reads
  for (const PoolShape& s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.c);
    CAPTURE(s.h);
    CAPTURE(s.w);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w,
                      ny = static_cast<std::size_t>(s.n) * s.c * (s.h / 2) * (s.w / 2);
    auto x = uniform(nx, g, -1.0f, 1.0f);
    // Ties (each window position copied from another), NaNs and infinities.
    std::uniform_int_distribution<std::size_t> pick(0, nx - 1);
    for (std::size_t t = 0; t < nx / 8 + 1; ++t) {
      const std::size_t j = pick(g);
      const std::size_t top = (j / (2 * s.w)) * (2 * s.w) + (j % s.w) / 2 * 2;  // window's (0,0)
      const std::size_t cands[4] = {top, top + 1, top + s.w, top + s.w + 1};
      x[cands[t % 4]] = x[cands[(t + 1 + t / 4) % 4]];
    }
    for (std::size_t t = 0; t < nx / 50 + 1; ++t) x[pick(g)] = (t % 3 == 0) ? kNaN : (t % 3 == 1 ? kInf : -kInf);
    std::vector<float> y_ref(ny), y(ny, 7.0f);
    std::vector<int32_t> am_ref(ny), am(ny, -1);
    ref::maxpool2x2_forward(s, x.data(), y_ref.data(), am_ref.data());
    cpu::maxpool2x2_forward(s, x.data(), y.data(), am.data());
    check_bits("maxpool y", y, y_ref);
    check_bits("maxpool argmax", am, am_ref);
    // The argmax points into the right window at the value returned.
    const int oh_n = s.h / 2, ow_n = s.w / 2;
    std::size_t wrong = 0;
    for (std::size_t o = 0; o < ny; ++o) {
      const int nc = static_cast<int>(o / (oh_n * ow_n)), oh = static_cast<int>(o / ow_n % oh_n),
                ow = static_cast<int>(o % ow_n);
      const int a = am_ref[o];
      const int ih = a / s.w % s.h, iw = a % s.w;
      wrong += a / (s.h * s.w) != nc || ih / 2 != oh || iw / 2 != ow ||
               std::memcmp(&x[a], &y_ref[o], sizeof(float)) != 0;
    }
    CHECK(wrong == 0);

    const auto dy = uniform(ny, g, -1.0f, 1.0f);
    std::vector<float> dx_ref(nx), dx(nx, kNaN);
    ref::maxpool2x2_backward(s, dy.data(), am_ref.data(), dx_ref.data());
    cpu::maxpool2x2_backward(s, dy.data(), am_ref.data(), dx.data());
    check_bits("maxpool dx", dx, dx_ref);
  }
}

TEST_CASE("ref maxpool follows PyTorch's tie and NaN rule") {
  const PoolShape s{1, 1, 2, 4};
  // Window 0: {1, 3 / 3, 2} -> first 3 (index 1). Window 1: {NaN, 5 / 9, NaN} -> first NaN.
  const std::vector<float> x = {1.0f, 3.0f, kNaN, 5.0f, 3.0f, 2.0f, 9.0f, kNaN};
  for (const bool fast : {false, true}) {
    std::vector<float> y(2);
    std::vector<int32_t> am(2);
    (fast ? cpu::maxpool2x2_forward : ref::maxpool2x2_forward)(s, x.data(), y.data(), am.data());
    CHECK(y[0] == 3.0f);
    CHECK(am[0] == 1);
    CHECK(std::isnan(y[1]));
    CHECK(am[1] == 7);  // NaN at the last position replaces the first NaN (NaN "moves on")
  }
}

// ---------------------------------------------------------------------------------
// Dropout
// ---------------------------------------------------------------------------------
TEST_CASE("cpu dropout forward/backward match ref bit for bit (masks from Philox)") {
  std::mt19937 g(601);
  const PhiloxStream stream{0x0123456789abcdefull, 3};
  for (const int64_t n : {1, 13, 1000, 4099, 100003})
    for (const float p : {0.0f, 0.25f, 0.5f, 0.9f, 1.0f})
      for (const uint64_t offset : {uint64_t{0}, uint64_t{3}, (uint64_t{1} << 33) + 5}) {
        CAPTURE(n);
        CAPTURE(p);
        CAPTURE(offset);
        const auto x = uniform(static_cast<std::size_t>(n), g, -2.0f, 2.0f);
        std::vector<float> y_ref(x.size()), y(x.size(), kNaN);
        std::vector<uint8_t> k_ref(x.size()), k(x.size(), 7);
        ref::dropout_forward(n, x.data(), p, stream, offset, y_ref.data(), k_ref.data());
        cpu::dropout_forward(n, x.data(), p, stream, offset, y.data(), k.data());
        check_bits("dropout keep", k, k_ref);
        check_bits("dropout y", y, y_ref);
        // The documented rule, independent of both backends.
        const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
        int64_t kept = 0, wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          const bool keep =
              engine::philox_uniform(engine::philox_at(stream, offset + static_cast<uint64_t>(i))) >= p;
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
        std::vector<float> dx_ref(x.size()), dx(x.size(), kNaN);
        ref::dropout_backward(n, dy.data(), k_ref.data(), p, dx_ref.data());
        cpu::dropout_backward(n, dy.data(), k_ref.data(), p, dx.data());
        check_bits("dropout dx", dx, dx_ref);
      }
}

// ---------------------------------------------------------------------------------
// Cross-entropy
// ---------------------------------------------------------------------------------
TEST_CASE("cpu cross_entropy matches ref (loss, correct, dlogits; grad_scale 1 and 65536; dlogits null)") {
  std::mt19937 g(701);
  struct Case {
    int n, classes;
    float spread;
  };
  const Case cases[] = {{1, 10, 3.0f}, {3, 10, 3.0f}, {13, 10, 10.0f}, {64, 10, 3.0f},
                        {5, 3, 100.0f}, {4, 1, 1.0f}};
  for (const Case& cs : cases) {
    CAPTURE(cs.n);
    CAPTURE(cs.classes);
    auto z = uniform(static_cast<std::size_t>(cs.n) * cs.classes, g, -cs.spread, cs.spread);
    std::uniform_int_distribution<int32_t> lab(0, cs.classes - 1);
    std::vector<int32_t> labels(cs.n);
    for (auto& l : labels) l = lab(g);
    // Row 0: a tie between classes 1 and 2 for the maximum (first maximum wins).
    if (cs.classes >= 3) {
      z[1] = z[2] = cs.spread + 1.0f;
      labels[0] = cs.n > 1 ? 2 : 1;
    }
    double zmax = 0.0;
    for (float v : z) zmax = std::max(zmax, static_cast<double>(std::fabs(v)));
    for (const float scale : {1.0f, 65536.0f}) {
      CAPTURE(scale);
      const std::size_t nz = z.size();
      std::vector<float> l_ref(cs.n), c_ref(cs.n), d_ref(nz);
      std::vector<float> l(cs.n, kNaN), c(cs.n, kNaN), d(nz, kNaN);
      ref::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), scale, d_ref.data(),
                         l_ref.data(), c_ref.data());
      cpu::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), scale, d.data(), l.data(),
                         c.data());
      check_close("ce loss", l, l_ref,
                  [&](std::size_t i) { return 4.0 * kU * (std::fabs(l_ref[i]) + zmax) + 1e-30; });
      check_bits("ce correct", c, c_ref);
      check_close("ce dlogits", d, d_ref, [&](std::size_t i) {
        return 4.0 * kU * std::fabs(d_ref[i]) + 1e-7 * scale / cs.n;
      });
      // dlogits null: the per-sample outputs do not change.
      std::vector<float> l2(cs.n, kNaN), c2(cs.n, kNaN);
      cpu::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), scale, nullptr, l2.data(),
                         c2.data());
      check_bits("ce loss with dlogits null", l2, l);
      check_bits("ce correct with dlogits null", c2, c);
      std::vector<float> l3(cs.n, kNaN), c3(cs.n, kNaN);
      ref::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), scale, nullptr, l3.data(),
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
    // where dlogits(1) underflows into float denormals (softmax ~ e^-200 in the spread-100 case).
    std::vector<float> l(cs.n), c(cs.n), d1(z.size()), d2(z.size());
    cpu::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), 1.0f, d1.data(), l.data(), c.data());
    cpu::cross_entropy(cs.n, cs.n, cs.classes, z.data(), labels.data(), 65536.0f, d2.data(), l.data(),
                       c.data());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < z.size(); ++i)
      wrong += std::fabs(d1[i]) >= std::numeric_limits<float>::min() && d2[i] != 65536.0f * d1[i];
    CHECK(wrong == 0);
  }
}

// ---------------------------------------------------------------------------------
// softmax
// ---------------------------------------------------------------------------------
// Both compute in double and round each probability to float once; their exponentials
// differ (det::exp against libm's, each within about 1 ulp of double), so the floats
// may differ by one float ulp where the double lies next to a rounding boundary.
TEST_CASE("cpu softmax matches ref within one float ulp; rows sum to 1; no overflow") {
  std::mt19937 g(790);
  const float inf = std::numeric_limits<float>::infinity();
  for (const int classes : {1, 2, 10, 33}) {
    for (const int n : {0, 1, 7, 1000}) {
      CAPTURE(classes);
      CAPTURE(n);
      auto z = uniform(static_cast<std::size_t>(n) * classes, g, -30.0f, 30.0f);
      if (n >= 7 && classes >= 2) {
        z[0] = 1e30f;                               // huge: no overflow around the maximum
        z[static_cast<std::size_t>(classes)] = -inf;  // row 1: a class that cannot happen
        for (int k = 0; k < classes; ++k) z[2 * static_cast<std::size_t>(classes) + k] = 3.5f;  // all equal
      }
      std::vector<float> p(z.size()), p_ref(z.size());
      cpu::softmax(n, classes, z.data(), p.data());
      ref::softmax(n, classes, z.data(), p_ref.data());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        const float ulp = std::nextafter(p_ref[i], inf) - p_ref[i];
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

// ---------------------------------------------------------------------------------
// reduce_sum, gather_batch
// ---------------------------------------------------------------------------------
TEST_CASE("cpu reduce_sum matches ref") {
  std::mt19937 g(801);
  for (const int64_t n : {0, 1, 13, 4097, 100003, 1 << 20}) {
    CAPTURE(n);
    const auto x = uniform(static_cast<std::size_t>(n), g, -1.0f, 1.0f);
    double abs_sum = 0.0;
    for (float v : x) abs_sum += std::fabs(v);
    const double r = ref::reduce_sum(n, x.data());
    const double c = cpu::reduce_sum(n, x.data());
    CHECK(std::fabs(r - c) <= 1e-12 * abs_sum);
    // Deterministic: the same value on a second call.
    CHECK(cpu::reduce_sum(n, x.data()) == c);
  }
  // Small integers sum exactly.
  std::vector<float> ints(10001);
  for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  double want = 0.0;
  for (float v : ints) want += v;
  CHECK(cpu::reduce_sum(static_cast<int64_t>(ints.size()), ints.data()) == want);
  CHECK(ref::reduce_sum(static_cast<int64_t>(ints.size()), ints.data()) == want);
}

TEST_CASE("cpu gather_batch matches ref bit for bit") {
  std::mt19937 g(901);
  for (const int pixels : {784, 5})
    for (const int n : {1, 3, 13, 64}) {
      CAPTURE(pixels);
      CAPTURE(n);
      const int images_n = 20;
      std::uniform_int_distribution<int> byte(0, 255), idx(0, images_n - 1);
      std::vector<uint8_t> images(static_cast<std::size_t>(images_n) * pixels), labels(images_n);
      for (auto& b : images) b = static_cast<uint8_t>(byte(g));
      for (auto& l : labels) l = static_cast<uint8_t>(byte(g) % 10);
      images[0] = 0;
      images[1] = 255;
      std::vector<int32_t> indices(n);
      for (auto& i : indices) i = idx(g);
      indices[0] = 0;                      // the image with the 0 and 255 bytes
      if (n > 2) indices[2] = indices[1];  // a repeated index
      const float mean = 0.2860f, std = 0.3530f;
      std::vector<float> out_ref(static_cast<std::size_t>(n) * pixels), out(out_ref.size(), kNaN);
      std::vector<int32_t> lab_ref(n), lab(n, -1);
      ref::gather_batch(n, pixels, images.data(), labels.data(), indices.data(), mean, std,
                        out_ref.data(), lab_ref.data());
      cpu::gather_batch(n, pixels, images.data(), labels.data(), indices.data(), mean, std,
                        out.data(), lab.data());
      check_bits("gather out", out, out_ref);
      check_bits("gather labels", lab, lab_ref);
      int wrong = 0;  // the definition: (byte / 255 - mean) / std, to float accuracy
      for (int i = 0; i < n; ++i) {
        CHECK(lab_ref[i] == labels[indices[i]]);
        for (int p = 0; p < pixels; ++p) {
          const double want = (images[static_cast<std::size_t>(indices[i]) * pixels + p] / 255.0 - mean) / std;
          wrong += !(std::fabs(out_ref[static_cast<std::size_t>(i) * pixels + p] - want) <=
                     1e-6 * (1.0 + std::fabs(want)));
        }
      }
      CHECK(wrong == 0);
    }
}

// ---------------------------------------------------------------------------------
// Optimizer and loss-scaler kernels
// ---------------------------------------------------------------------------------
TEST_CASE("cpu adam_update matches ref bit for bit") {
  std::mt19937 g(1001);
  for (const int64_t n : {1, 13, 4096, 4097, 20011})
    for (const WeightDecayMode mode : {WeightDecayMode::Decoupled, WeightDecayMode::L2})
      for (const float wd : {0.0f, 0.05f}) {
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
        std::vector<float> m_ref(p_ref.size(), 0.0f), v_ref(p_ref.size(), 0.0f);
        auto p = p_ref, m = m_ref, v = v_ref;
        for (int t = 1; t <= 3; ++t) {
          auto grad = uniform(p.size(), g, -0.1f, 0.1f);
          grad[0] = 0.0f;
          if (grad.size() > 1) grad[1] = 1e-30f;
          AdamStepFactors f{};
          f.step_size = static_cast<float>(h.lr / (1.0 - std::pow(0.9, t)));
          f.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
          f.decay_factor = static_cast<float>(1.0 - 3e-3 * wd);
          f.one_minus_beta1 = static_cast<float>(1.0 - 0.9);
          f.one_minus_beta2 = static_cast<float>(1.0 - 0.999);
          ref::adam_update(n, p_ref.data(), grad.data(), m_ref.data(), v_ref.data(), h, f);
          cpu::adam_update(n, p.data(), grad.data(), m.data(), v.data(), h, f);
          check_bits("adam param", p, p_ref);
          check_bits("adam exp_avg", m, m_ref);
          check_bits("adam exp_avg_sq", v, v_ref);
        }
      }
}

TEST_CASE("cpu unscale_check matches ref; found_inf set on inf/NaN and never reset") {
  std::mt19937 g(1101);
  const float inv_scale = 1.0f / 65536.0f;
  for (const int64_t n : {1, 13, 5000, 100003}) {
    CAPTURE(n);
    const auto grad0 = uniform(static_cast<std::size_t>(n), g, -70000.0f, 70000.0f);
    auto run = [&](const std::vector<float>& in, float s, int32_t flag_in, std::vector<float>& out_ref,
                   int32_t& flag_ref, std::vector<float>& out_cpu, int32_t& flag_cpu) {
      out_ref = in;
      out_cpu = in;
      flag_ref = flag_in;
      flag_cpu = flag_in;
      ref::unscale_check(n, out_ref.data(), s, &flag_ref);
      cpu::unscale_check(n, out_cpu.data(), s, &flag_cpu);
      check_bits("unscaled grad", out_cpu, out_ref);
    };
    std::vector<float> a, b;
    int32_t fa = -1, fb = -1;

    // Finite gradients: flag stays 0; and stays 1 when already set.
    run(grad0, inv_scale, 0, a, fa, b, fb);
    CHECK(fa == 0);
    CHECK(fb == 0);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < a.size(); ++i) wrong += a[i] != grad0[i] * inv_scale;
    CHECK(wrong == 0);
    run(grad0, inv_scale, 1, a, fa, b, fb);
    CHECK(fa == 1);
    CHECK(fb == 1);

    // One inf (first, middle or last element), one NaN, -inf.
    const std::size_t positions[] = {0, static_cast<std::size_t>(n / 2), static_cast<std::size_t>(n - 1)};
    for (const float bad : {kInf, kNaN, -kInf})
      for (const std::size_t pos : positions) {
        CAPTURE(bad);
        CAPTURE(pos);
        auto gr = grad0;
        gr[pos] = bad;
        run(gr, inv_scale, 0, a, fa, b, fb);
        CHECK(fa == 1);
        CHECK(fb == 1);
        run(gr, inv_scale, 1, a, fa, b, fb);
        CHECK(fa == 1);
        CHECK(fb == 1);
      }
    // A finite value that overflows once unscaled (inv_scale > 1).
    auto gr = grad0;
    gr[static_cast<std::size_t>(n - 1)] = 3e38f;
    run(gr, 4.0f, 0, a, fa, b, fb);
    CHECK(fa == 1);
    CHECK(fb == 1);
  }
}

// ---------------------------------------------------------------------------------
// Thread-count independence of the fast path
// ---------------------------------------------------------------------------------
namespace {
struct ThreadGuard {
  int saved = omp_get_max_threads();
  ~ThreadGuard() { omp_set_num_threads(saved); }
};
}  // namespace

namespace {
using Outputs = std::vector<std::vector<float>>;  // y, dx, dw, db

// Runs `op` with 1, 2 and 3 threads into fresh outputs of the given sizes: the bits of
// y, dx, dw and db must not depend on the thread count.
template <typename Op>
void check_bits_across_thread_counts(const std::string& what, const std::vector<std::size_t>& sizes, Op op) {
  const char* names[] = {" y", " dx", " dw", " db"};
  Outputs first;
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    Outputs out;
    for (std::size_t n : sizes) out.emplace_back(n);
    op(out);
    if (threads == 1) {
      first = out;
      continue;
    }
    for (std::size_t i = 0; i < out.size(); ++i) check_bits(what + names[i], out[i], first[i]);
  }
}
}  // namespace

TEST_CASE("cpu conv2d and linear give the same bits with 1, 2 and 3 threads") {
  ThreadGuard guard;
  std::mt19937 g(1201);
  const ConvShape conv_shapes[] = {{4, 32, 14, 14, 64, 3, 3, 1}, {13, 3, 10, 9, 8, 3, 3, 1},
                                   {1, 2, 5, 5, 3, 2, 3, 0}};
  for (const ConvShape& s : conv_shapes) {
    CAPTURE(conv_name(s));
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    const std::size_t nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s;
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const auto x = uniform(nx, g, -1.0f, 1.0f), w = uniform(nw, g, -0.2f, 0.2f),
               b = uniform(s.k, g, -0.2f, 0.2f), dy = uniform(ny, g, -1.0f, 1.0f);
    check_bits_across_thread_counts("conv", {ny, nx, nw, static_cast<std::size_t>(s.k)}, [&](Outputs& o) {
      cpu::conv2d_forward(s, x.data(), w.data(), b.data(), o[0].data());
      cpu::conv2d_backward(s, x.data(), w.data(), dy.data(), o[1].data(), o[2].data(), o[3].data());
    });
  }
  const LinearShape lin_shapes[] = {{4, 3136, 128}, {13, 128, 10}, {64, 128, 10}, {3, 5, 7}};
  for (const LinearShape& s : lin_shapes) {
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.in, nw = static_cast<std::size_t>(s.out) * s.in,
                      ny = static_cast<std::size_t>(s.n) * s.out;
    const auto x = uniform(nx, g, -1.0f, 1.0f), w = uniform(nw, g, -0.1f, 0.1f),
               b = uniform(s.out, g, -0.1f, 0.1f), dy = uniform(ny, g, -1.0f, 1.0f);
    check_bits_across_thread_counts("linear", {ny, nx, nw, static_cast<std::size_t>(s.out)}, [&](Outputs& o) {
      cpu::linear_forward(s, x.data(), w.data(), b.data(), o[0].data());
      cpu::linear_backward(s, x.data(), w.data(), dy.data(), o[1].data(), o[2].data(), o[3].data());
    });
  }
  // Batchnorm reduces inside one thread per channel: also thread-count independent.
  const BatchNormShape bs{13, 8, 49};
  const auto x = bn_input(bs, g);
  const auto gamma = uniform(bs.c, g, 0.5f, 1.5f), beta = uniform(bs.c, g, -1.0f, 1.0f),
             dy = uniform(x.size(), g, -1.0f, 1.0f);
  std::vector<float> y1, dx1, dg1;
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    std::vector<float> rm(bs.c, 0.0f), rv(bs.c, 1.0f), sm(bs.c), si(bs.c), y(x.size()), dx(x.size()),
        dg(bs.c), dbeta(bs.c);
    cpu::batchnorm_forward_train(bs, x.data(), gamma.data(), beta.data(), 1e-5f, 0.1f, rm.data(),
                                 rv.data(), sm.data(), si.data(), y.data());
    cpu::batchnorm_backward(bs, x.data(), dy.data(), gamma.data(), sm.data(), si.data(), dx.data(),
                            dg.data(), dbeta.data());
    if (threads == 1) {
      y1 = y, dx1 = dx, dg1 = dg;
      continue;
    }
    check_bits("bn y", y, y1);
    check_bits("bn dx", dx, dx1);
    check_bits("bn dgamma", dg, dg1);
  }
}

TEST_CASE("cpu copy_bypassing_cache copies every byte, at every alignment and size") {
  // Sizes around the streaming threshold and its 64-byte body, offsets that misalign the
  // destination and the source differently; the reference is a byte loop.
  std::mt19937 gen(7);
  const std::size_t threshold = engine::kernels::cpu::kStreamingMinBytes;
  std::vector<std::size_t> sizes{0, 1, 15, 64, 1000, threshold - 1, threshold, threshold + 1,
                                 threshold + 63, threshold + 65, 5'080'000 + 13};
  for (std::size_t bytes : sizes) {
    for (std::size_t dst_off : {0, 1, 8, 15}) {
      for (std::size_t src_off : {0, 3, 16}) {
        std::vector<unsigned char> src(bytes + 32), dst(bytes + 32, 0xA5), expect(dst);
        for (auto& b : src) b = static_cast<unsigned char>(gen());
        for (std::size_t i = 0; i < bytes; ++i) expect[dst_off + i] = src[src_off + i];
        engine::kernels::cpu::copy_bypassing_cache(dst.data() + dst_off, src.data() + src_off, bytes);
        INFO("bytes " << bytes << ", dst offset " << dst_off << ", src offset " << src_off);
        CHECK(dst == expect);  // the bytes outside [dst_off, dst_off + bytes) untouched too
      }
    }
  }
}
