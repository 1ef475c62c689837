// The engine's GEMM (kernels/cpu/gemm.h) on every instruction-set path this CPU runs:
// bit for bit the definition (each element one std::fma chain over k = 0..K-1 from its
// initial value), on ragged shapes, every transpose, beta 0 and 1, misaligned and
// padded operands; and the definition itself within the error bound of a K-term float
// sum of products against a double-precision product (so the chain computes the right
// thing, not only the same thing).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include <cstring>

using engine::kernels::cpu::CpuKernels;
using engine::kernels::cpu::Trans;
namespace cpu = engine::kernels::cpu;

namespace {

struct Problem {
  Trans ta, tb;
  int m, n, k;
  int lda, ldb, ldc;
  float beta;
  int offset;  // floats from a 64-byte boundary, for every operand
};

// Values with a spread of exponents and signs, so a different order of operations
// almost surely changes a bit.
std::vector<float> random_floats(std::size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;  // [0, 1)
    f = static_cast<float>((u - 0.5) * std::ldexp(1.0, static_cast<int>(x % 7) - 3));
  }
  return v;
}

float op_a(const Problem& p, const float* a, int i, int kk) {
  return p.ta == Trans::No ? a[static_cast<int64_t>(i) * p.lda + kk] : a[static_cast<int64_t>(kk) * p.lda + i];
}
float op_b(const Problem& p, const float* b, int kk, int j) {
  return p.tb == Trans::No ? b[static_cast<int64_t>(kk) * p.ldb + j] : b[static_cast<int64_t>(j) * p.ldb + kk];
}

// The definition, as plainly as it can be written.
void definition(const Problem& p, const float* a, const float* b, float* c) {
  for (int i = 0; i < p.m; ++i)
    for (int j = 0; j < p.n; ++j) {
      float acc = p.beta == 0.0f ? 0.0f : c[static_cast<int64_t>(i) * p.ldc + j];
      for (int kk = 0; kk < p.k; ++kk) acc = std::fma(op_a(p, a, i, kk), op_b(p, b, kk, j), acc);
      c[static_cast<int64_t>(i) * p.ldc + j] = acc;
    }
}

struct Operands {
  std::vector<float> a, b, c;
  float* pa;
  float* pb;
  float* pc;
  Operands(const Problem& p, uint64_t seed) {
    const int64_t a_rows = p.ta == Trans::No ? p.m : p.k, b_rows = p.tb == Trans::No ? p.k : p.n;
    pa = place(a, static_cast<std::size_t>(a_rows * p.lda + 32), seed) + p.offset;
    pb = place(b, static_cast<std::size_t>(b_rows * p.ldb + 32), seed + 1) + p.offset;
    pc = place(c, static_cast<std::size_t>(int64_t{p.m} * p.ldc + 32), seed + 2) + p.offset;
  }
  // n random floats from a 64-byte boundary inside v (the same values wherever v is).
  static float* place(std::vector<float>& v, std::size_t n, uint64_t seed) {
    v.assign(n + 16, 0.0f);
    auto addr = reinterpret_cast<uintptr_t>(v.data());
    float* base = v.data() + ((64 - addr % 64) % 64) / sizeof(float);
    const std::vector<float> values = random_floats(n, seed);
    std::copy(values.begin(), values.end(), base);
    return base;
  }
};

std::vector<CpuKernels> paths_here() {
  std::vector<CpuKernels> paths;
  for (CpuKernels k : {CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Portable})
    if (cpu::cpu_supports(k)) paths.push_back(k);
  return paths;
}

// Every path against the definition, bit for bit, C's padding included (untouched).
void check_problem(const Problem& p, uint64_t seed) {
  Operands ref(p, seed);
  definition(p, ref.pa, ref.pb, ref.pc);
  std::vector<std::string> names;
  for (CpuKernels path : paths_here()) names.push_back(cpu::cpu_kernels_name(path));
  names.push_back("portable, software fma");
  for (std::size_t v = 0; v < names.size(); ++v) {
    CAPTURE(names[v]);
    Operands got(p, seed);
    if (v + 1 < names.size())
      cpu::gemm_with(paths_here()[v], p.ta, p.tb, p.m, p.n, p.k, got.pa, p.lda, got.pb, p.ldb, p.beta, got.pc, p.ldc);
    else  // what a CPU without FMA runs
      cpu::gemm_portable_software_fma(p.ta, p.tb, p.m, p.n, p.k, got.pa, p.lda, got.pb, p.ldb, p.beta, got.pc, p.ldc);
    // From each one's 64-byte-aligned start (the vectors sit at different addresses):
    // C and the floats around it.
    const float* g = got.pc - p.offset;
    const float* r = ref.pc - p.offset;
    const int64_t span = int64_t{p.m} * p.ldc + 16;
    int64_t differing = 0, first = -1;
    for (int64_t i = 0; i < span; ++i)
      if (std::memcmp(g + i, r + i, sizeof(float)) != 0) {
        if (first < 0) first = i;
        ++differing;
      }
    CAPTURE(first);
    CHECK(differing == 0);
  }
}

std::string describe(const Problem& p) {
  return std::string(p.ta == Trans::No ? "N" : "T") + (p.tb == Trans::No ? "N" : "T") + " m=" + std::to_string(p.m) +
         " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) + " beta=" + std::to_string(static_cast<int>(p.beta)) +
         " offset=" + std::to_string(p.offset);
}

Problem make(Trans ta, Trans tb, int m, int n, int k, float beta, int offset, int pad) {
  Problem p{ta, tb, m, n, k, 0, 0, 0, beta, offset};
  p.lda = (ta == Trans::No ? k : m) + pad;
  p.ldb = (tb == Trans::No ? n : k) + pad;
  p.ldc = n + pad;
  return p;
}

}  // namespace

TEST_CASE("the GEMM paths this CPU runs include the portable one, and the chosen one is among them") {
  const std::vector<CpuKernels> paths = paths_here();
  REQUIRE(!paths.empty());
  CHECK(paths.back() == CpuKernels::Portable);
  MESSAGE("paths here: " << [&] {
    std::string s;
    for (CpuKernels k : paths) s += std::string(cpu::cpu_kernels_name(k)) + " ";
    return s;
  }());
  if (!std::getenv("ENGINE_CPU_KERNELS")) CHECK(cpu::cpu_kernels() == paths.front());
}

TEST_CASE("every path is the definition bit for bit: ragged shapes, transposes, beta 0 and 1, offsets") {
  // Around the tiles (MR 4/6/8 and AVX-512's 9-12, NR 16/32) and blocks (KC 256, MC 96, NC 2048), primes.
  const int sizes[] = {1, 2, 3, 5, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 31, 33, 47, 97};
  const int ks[] = {1, 2, 9, 12, 13, 31, 255, 256, 257, 600};
  uint64_t seed = 1;
  int problems = 0;
  for (Trans ta : {Trans::No, Trans::Yes})
    for (Trans tb : {Trans::No, Trans::Yes})
      for (int m : sizes)
        for (int n : {1, 7, 16, 17, 33, 65})
          for (int k : ks) {
            if ((m * 7 + n * 3 + k) % 3 != 0) continue;  // a third of the grid, all sizes still met
            const float beta = (m + n + k) % 2 ? 1.0f : 0.0f;
            const Problem p = make(ta, tb, m, n, k, beta, static_cast<int>(seed % 4), static_cast<int>(seed % 3));
            CAPTURE(describe(p));
            check_problem(p, seed++);
            ++problems;
          }
  MESSAGE(problems << " problems");
}

TEST_CASE("every path is the definition bit for bit at the model's own shapes and across the blocks") {
  struct Shape {
    Trans ta, tb;
    int m, n, k;
    float beta;
  };
  // conv1/conv2 forward, dW and dX by sub-batch of 8 images; fc1/fc2 by chunk of 16 rows;
  // and past KC, MC and NC.
  const Shape shapes[] = {
      {Trans::No, Trans::No, 32, 6272, 9, 1.0f},     {Trans::No, Trans::Yes, 32, 9, 6272, 0.0f},
      {Trans::No, Trans::Yes, 32, 9, 6272, 1.0f},    {Trans::No, Trans::No, 64, 1568, 288, 1.0f},
      {Trans::No, Trans::Yes, 64, 288, 1568, 0.0f},  {Trans::Yes, Trans::No, 288, 1568, 64, 0.0f},
      {Trans::No, Trans::Yes, 16, 128, 3136, 1.0f},  {Trans::Yes, Trans::No, 128, 3136, 16, 0.0f},
      {Trans::No, Trans::No, 16, 3136, 128, 0.0f},   {Trans::No, Trans::Yes, 16, 10, 128, 1.0f},
      {Trans::Yes, Trans::No, 10, 128, 16, 0.0f},    {Trans::No, Trans::No, 16, 128, 10, 0.0f},
      {Trans::No, Trans::No, 193, 2049 + 40, 513, 1.0f},
  };
  uint64_t seed = 1000;
  for (const Shape& s : shapes) {
    const Problem p = make(s.ta, s.tb, s.m, s.n, s.k, s.beta, 1, 0);
    CAPTURE(describe(p));
    check_problem(p, seed++);
  }
}

TEST_CASE("the definition is the product: within the float error bound of a K-term sum") {
  // |fl(sum) - sum| <= gamma_K * sum |a_i b_i| (+ |c|), gamma_K = K u / (1 - K u).
  for (int k : {1, 10, 300, 3136}) {
    CAPTURE(k);
    const Problem p = make(Trans::No, Trans::No, 5, 7, k, 1.0f, 0, 0);
    Operands o(p, 77 + k);
    std::vector<double> exact(35), magnitude(35);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 7; ++j) {
        double s = o.pc[i * p.ldc + j], mag = std::fabs(s);
        for (int kk = 0; kk < k; ++kk) {
          const double t = static_cast<double>(op_a(p, o.pa, i, kk)) * op_b(p, o.pb, kk, j);
          s += t, mag += std::fabs(t);
        }
        exact[i * 7 + j] = s, magnitude[i * 7 + j] = mag;
      }
    cpu::gemm(p.ta, p.tb, p.m, p.n, p.k, o.pa, p.lda, o.pb, p.ldb, p.beta, o.pc, p.ldc);
    const double u = std::ldexp(1.0, -24), gamma = (k + 1) * u / (1 - (k + 1) * u);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 7; ++j) {
        CAPTURE(i);
        CAPTURE(j);
        CHECK(std::fabs(o.pc[i * p.ldc + j] - exact[i * 7 + j]) <= gamma * magnitude[i * 7 + j]);
      }
  }
}

TEST_CASE("beta 0 ignores what C held, NaN included; K = 0 leaves C, or zeroes it") {
  for (CpuKernels path : paths_here()) {
    CAPTURE(std::string(cpu::cpu_kernels_name(path)));
    std::vector<float> a(3 * 4, 1.0f), b(4 * 5, 2.0f), c(3 * 5, std::nanf(""));
    cpu::gemm_with(path, Trans::No, Trans::No, 3, 5, 4, a.data(), 4, b.data(), 5, 0.0f, c.data(), 5);
    for (float v : c) CHECK(v == 8.0f);
    cpu::gemm_with(path, Trans::No, Trans::No, 3, 5, 0, a.data(), 4, b.data(), 5, 1.0f, c.data(), 5);
    for (float v : c) CHECK(v == 8.0f);
    cpu::gemm_with(path, Trans::No, Trans::No, 3, 5, 0, a.data(), 4, b.data(), 5, 0.0f, c.data(), 5);
    for (float v : c) CHECK(v == 0.0f);
  }
}

// The implicit-GEMM operands (kernels/cpu/gemm.h: Operand::patches, Operand::image_rows)
// against the matrices they stand for, stored by this test's own loops: every path, the
// three products a convolution runs (forward, weight gradient, data gradient), bit for
// bit the dense GEMM's definition on the stored matrices. Shapes: pads 0..2, kernels
// 1x1..5x5 and 3x1, tiny and odd images, and the model's own, with pixel counts that
// cross slivers, images and k blocks at every phase.
TEST_CASE("implicit-GEMM operands are the im2col and image matrices, bit for bit, on every path") {
  using engine::kernels::ConvShape;
  using cpu::Operand;
  struct Case {
    int images, c, h, w, r, s, pad, m;
  };
  const Case cases[] = {
      {1, 1, 1, 1, 1, 1, 0, 1},  {3, 2, 5, 7, 3, 3, 1, 5},  {2, 3, 6, 5, 5, 5, 2, 9},  {4, 1, 9, 4, 3, 1, 0, 8},
      {5, 2, 3, 3, 3, 3, 2, 3},  {2, 1, 28, 28, 3, 3, 1, 32}, {3, 32, 14, 14, 3, 3, 1, 17}, {17, 2, 7, 7, 3, 3, 1, 33},
      // One channel, 3 x 3, 8 to 32 rows of dy: conv1's weight gradient kernel
      // (TapsByChannels), with images of fewer pixels than a block, ragged last
      // blocks, rows shorter than a block, and pads 0 and 2.
      {3, 1, 5, 7, 3, 3, 1, 16}, {2, 1, 6, 5, 3, 3, 2, 8},  {4, 1, 7, 7, 3, 3, 0, 32}, {2, 1, 9, 20, 3, 3, 1, 24},
      {3, 1, 12, 12, 3, 3, 1, 16},
  };
  uint64_t seed = 7;
  for (const Case& t : cases) {
    ConvShape s;
    s.n = t.images, s.c = t.c, s.h = t.h, s.w = t.w, s.k = t.m, s.r = t.r, s.s = t.s, s.pad = t.pad;
    const int taps = s.c * s.r * s.s, ohw = s.out_h() * s.out_w(), pixels = t.images * ohw;
    const std::string shape = std::to_string(t.images) + " images " + std::to_string(s.c) + "x" + std::to_string(s.h) +
                              "x" + std::to_string(s.w) + " kernel " + std::to_string(s.r) + "x" + std::to_string(s.s) +
                              " pad " + std::to_string(s.pad);
    CAPTURE(shape);
    const std::vector<float> x = random_floats(static_cast<std::size_t>(t.images) * s.c * s.h * s.w, ++seed);
    std::vector<float> padded_store(cpu::padded_images_floats(s, t.images), std::nanf(""));
    const cpu::PaddedImages padded = cpu::pad_images(s, x.data(), t.images, padded_store.data());
    const int hp = s.h + 2 * s.pad, wp = s.w + 2 * s.pad, wide = t.images * s.out_h() * wp;
    // pad_images: the image inside its zeros, then zeros.
    for (int j = 0; j < t.images; ++j)
      for (int c = 0; c < s.c; ++c)
        for (int ih = 0; ih < hp; ++ih)
          for (int iw = 0; iw < wp; ++iw) {
            const int h = ih - s.pad, w = iw - s.pad;
            const bool inside = h >= 0 && h < s.h && w >= 0 && w < s.w;
            const float want = inside ? x[((static_cast<std::size_t>(j) * s.c + c) * s.h + h) * s.w + w] : 0.0f;
            REQUIRE(padded_store[((static_cast<std::size_t>(j) * s.c + c) * hp + ih) * wp + iw] == want);
          }
    for (std::size_t i = static_cast<std::size_t>(t.images) * s.c * hp * wp; i < padded_store.size(); ++i)
      REQUIRE(padded_store[i] == 0.0f);
    // The patches at the padded width: a tap's row is the padded images' floats from
    // its offset on, the columns past OW included.
    std::vector<float> wide_patches(static_cast<std::size_t>(taps) * wide);
    for (int tap = 0; tap < taps; ++tap)
      for (int j = 0; j < t.images; ++j)
        for (int col = 0; col < s.out_h() * wp; ++col) {
          const int c = tap / (s.r * s.s), r = tap / s.s % s.r, q = tap % s.s;
          wide_patches[static_cast<std::size_t>(tap) * wide + j * s.out_h() * wp + col] =
              padded_store[static_cast<std::size_t>(j) * s.c * hp * wp + (static_cast<std::size_t>(c) * hp + r) * wp + q + col];
        }
    // The stored im2col matrix, from its definition.
    std::vector<float> patches(static_cast<std::size_t>(taps) * pixels);
    for (int c = 0; c < s.c; ++c)
      for (int r = 0; r < s.r; ++r)
        for (int q = 0; q < s.s; ++q)
          for (int j = 0; j < t.images; ++j)
            for (int oh = 0; oh < s.out_h(); ++oh)
              for (int ow = 0; ow < s.out_w(); ++ow) {
                const int ih = oh + r - s.pad, iw = ow + q - s.pad;
                const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
                patches[static_cast<std::size_t>((c * s.r + r) * s.s + q) * pixels + j * ohw + oh * s.out_w() + ow] =
                    inside ? x[((static_cast<std::size_t>(j) * s.c + c) * s.h + ih) * s.w + iw] : 0.0f;
              }
    // Images of m rows ([images][m][ohw]) and their stored matrix [m, pixels].
    const std::vector<float> images = random_floats(static_cast<std::size_t>(t.images) * t.m * ohw, ++seed);
    std::vector<float> rows(images.size());
    for (int j = 0; j < t.images; ++j)
      for (int i = 0; i < t.m; ++i)
        for (int p = 0; p < ohw; ++p)
          rows[static_cast<std::size_t>(i) * pixels + j * ohw + p] = images[(static_cast<std::size_t>(j) * t.m + i) * ohw + p];
    const std::vector<float> weights = random_floats(static_cast<std::size_t>(t.m) * taps, ++seed);
    const std::vector<float> start =
        random_floats(static_cast<std::size_t>(std::max(t.m, taps)) * std::max({taps, pixels, wide}) + taps * wide, ++seed);

    struct Product {
      const char* name;
      int m, n, k;
      Operand a, b;              // the implicit operands
      Trans ta, tb;              // the stored equivalents
      const float *sa, *sb;
      int lda, ldb;
    };
    const Product products[] = {
        {"forward: W * P", t.m, pixels, taps, Operand::dense(Trans::No, weights.data(), taps),
         Operand::patches(Trans::No, padded, cpu::PatchColumns::Pixels), Trans::No, Trans::No, weights.data(),
         patches.data(), taps, pixels},
        {"forward at the padded width: W * P_wide", t.m, wide, taps, Operand::dense(Trans::No, weights.data(), taps),
         Operand::patches(Trans::No, padded, cpu::PatchColumns::PaddedRows), Trans::No, Trans::No, weights.data(),
         wide_patches.data(), taps, wide},
        {"weight gradient: D * P^T", t.m, taps, pixels, Operand::image_rows(Trans::No, images.data(), t.m, ohw),
         Operand::patches(Trans::Yes, padded, cpu::PatchColumns::Pixels), Trans::No, Trans::Yes, rows.data(),
         patches.data(), pixels, pixels},
        {"transposed at the padded width: P_wide * P_wide^T", taps, taps, wide,
         Operand::dense(Trans::No, wide_patches.data(), wide),
         Operand::patches(Trans::Yes, padded, cpu::PatchColumns::PaddedRows), Trans::No, Trans::Yes,
         wide_patches.data(), wide_patches.data(), wide, wide},
        // As the step runs the weight gradient (kernels/cpu/conv.cpp): the patches as
        // op(A), broadcast from the padded images in place (AForm::Gathered).
        {"weight gradient as the step runs it: P * D^T", taps, t.m, pixels,
         Operand::patches(Trans::No, padded, cpu::PatchColumns::Pixels), Operand::image_rows(Trans::Yes, images.data(), t.m, ohw),
         Trans::No, Trans::Yes, patches.data(), rows.data(), pixels, pixels},
        // A K that ends inside the last image.
        {"weight gradient to part of the last image: P * D^T", taps, t.m, pixels - (ohw + 1) / 2,
         Operand::patches(Trans::No, padded, cpu::PatchColumns::Pixels), Operand::image_rows(Trans::Yes, images.data(), t.m, ohw),
         Trans::No, Trans::Yes, patches.data(), rows.data(), pixels, pixels},
        {"at the padded width as op(A): P_wide * P_wide^T", taps, taps, wide,
         Operand::patches(Trans::No, padded, cpu::PatchColumns::PaddedRows),
         Operand::dense(Trans::Yes, wide_patches.data(), wide), Trans::No, Trans::Yes, wide_patches.data(),
         wide_patches.data(), wide, wide},
        {"data gradient: W^T * D", taps, pixels, t.m, Operand::dense(Trans::Yes, weights.data(), taps),
         Operand::image_rows(Trans::No, images.data(), t.m, ohw), Trans::Yes, Trans::No, weights.data(), rows.data(), taps,
         pixels},
    };
    for (const Product& p : products)
      for (float beta : {0.0f, 1.0f}) {
        CAPTURE(std::string(p.name));
        CAPTURE(beta);
        Problem def{p.ta, p.tb, p.m, p.n, p.k, p.lda, p.ldb, p.n, beta, 0};
        std::vector<float> want(start.begin(), start.begin() + static_cast<int64_t>(p.m) * p.n);
        definition(def, p.sa, p.sb, want.data());
        for (CpuKernels path : paths_here()) {
          CAPTURE(std::string(cpu::cpu_kernels_name(path)));
          std::vector<float> got(start.begin(), start.begin() + static_cast<int64_t>(p.m) * p.n);
          cpu::gemm_with(path, p.m, p.n, p.k, p.a, p.b, beta, got.data(), p.n);
          CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()) == 0);
        }
      }
  }
}

TEST_CASE("a chain started from row or column values is the chain from C filled with them, on every path") {
  // The convolutions start each chain from the channel's bias (RowValues), the linear
  // layer from the output's bias (ColumnValues): the same bits as filling C with the
  // bias and beta 1, whatever C held before (NaN here), ragged tiles and K blocks too.
  uint64_t seed = 5000;
  for (cpu::ChainStart start : {cpu::ChainStart::RowValues, cpu::ChainStart::ColumnValues})
    for (int m : {1, 7, 9, 32, 65})
      for (int n : {1, 17, 33, 100})
        for (int k : {0, 1, 9, 288, 600}) {
          const Problem p = make(Trans::No, Trans::Yes, m, n, k, 1.0f, static_cast<int>(seed % 4), 1);
          CAPTURE(describe(p));
          CAPTURE(start == cpu::ChainStart::RowValues ? "rows" : "columns");
          std::vector<float> values = random_floats(static_cast<std::size_t>(std::max(m, n)), seed + 7);
          values[0] = -0.0f;  // a signed zero starts a chain as itself
          Operands ref(p, seed);
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j)
              ref.pc[static_cast<int64_t>(i) * p.ldc + j] = start == cpu::ChainStart::RowValues ? values[i] : values[j];
          definition(p, ref.pa, ref.pb, ref.pc);
          for (CpuKernels path : paths_here()) {
            CAPTURE(cpu::cpu_kernels_name(path));
            Operands got(p, seed);
            for (int i = 0; i < m; ++i)
              for (int j = 0; j < n; ++j) got.pc[static_cast<int64_t>(i) * p.ldc + j] = std::nanf("");
            cpu::gemm_with(path, m, n, k, cpu::Operand::dense(p.ta, got.pa, p.lda), cpu::Operand::dense(p.tb, got.pb, p.ldb),
                           start, values.data(), got.pc, p.ldc);
            int64_t differing = 0;
            for (int i = 0; i < m; ++i)
              for (int j = 0; j <= n; ++j)  // and the float past each row, untouched
                differing += std::memcmp(got.pc + static_cast<int64_t>(i) * p.ldc + j,
                                         ref.pc + static_cast<int64_t>(i) * p.ldc + j, sizeof(float)) != 0;
            CHECK(differing == 0);
          }
          ++seed;
        }
}

TEST_CASE("ColumnsDone: the columns it reports are final when it reports them, and it ends at N") {
  // conv.cpp runs col2im on each image's columns as soon as the GEMM reports them: a
  // column reported before its last k block or row block would be read half summed.
  // Shapes with one pass, several k blocks, several row blocks, several column panels
  // (NC 2048), ragged tiles, and the empty cases.
  struct Shape {
    int m, n, k;
  };
  const Shape shapes[] = {{288, 1568, 64}, {33, 100, 600}, {200, 65, 300}, {2000, 40, 9},
                          {9, 2049 + 40, 20}, {5, 7, 0}, {0, 9, 5}, {17, 33, 1}};
  uint64_t seed = 9000;
  for (const Shape& s : shapes) {
    const Problem p = make(Trans::Yes, Trans::No, s.m, s.n, s.k, 0.0f, 0, 0);
    CAPTURE(describe(p));
    Operands ref(p, seed);
    definition(p, ref.pa, ref.pb, ref.pc);
    for (CpuKernels path : paths_here()) {
      CAPTURE(cpu::cpu_kernels_name(path));
      Operands got(p, seed);
      struct Seen {
        const Problem* p;
        const float* got;
        const float* want;
        std::vector<int> calls;
        int64_t not_final = 0;
      } seen{&p, got.pc, ref.pc, {}, 0};
      cpu::ColumnsDone done;
      done.context = &seen;
      done.call = [](void* context, int columns) {
        Seen& s = *static_cast<Seen*>(context);
        s.calls.push_back(columns);
        for (int i = 0; i < s.p->m; ++i)
          for (int j = 0; j < std::min(columns, s.p->n); ++j)
            s.not_final += std::memcmp(s.got + static_cast<int64_t>(i) * s.p->ldc + j,
                                       s.want + static_cast<int64_t>(i) * s.p->ldc + j, sizeof(float)) != 0;
      };
      cpu::gemm_with(path, p.m, p.n, p.k, cpu::Operand::dense(p.ta, got.pa, p.lda), cpu::Operand::dense(p.tb, got.pb, p.ldb),
                     cpu::ChainStart::Zero, nullptr, got.pc, p.ldc, done);
      CHECK(seen.not_final == 0);
      REQUIRE(!seen.calls.empty());
      CHECK(seen.calls.back() == p.n);
      CHECK(std::is_sorted(seen.calls.begin(), seen.calls.end()));
      CHECK(seen.calls.front() > 0);
    }
    ++seed;
  }
}
