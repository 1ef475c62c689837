// The engine's GEMM (kernels/cpu/gemm.h) at the shapes a training step runs, with the
// operands it passes (patches read from padded images, dy as image rows), on one
// thread (the step runs one GEMM per thread, inside its chunks), on every path this CPU
// supports, with OpenBLAS's sgemm beside it on the same products as stored matrices
// where the build found OpenBLAS (an optional peer; the engine does not use it). Each figure is GFLOP/s (2 M N K per call) and the
// share of that instruction set's measured FMA peak on one core (a loop of independent
// register FMAs, the fastest of its runs before each shape), then how much of each
// GEMM's time C's stores alone and the multiply-adds alone at peak would take.
// Usage: gemm_bench [seconds per figure, default 0.3]
// [shape: only the shapes whose name starts with it, e.g. "fc1 forward"]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"

#if defined(ENGINE_BENCH_OPENBLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace engine::kernels::cpu;
using engine::kernels::ConvShape;
using Clock = std::chrono::steady_clock;

namespace {

// The fastest of batches of calls (each batch about 5 ms), over `budget` seconds: this
// VM's other tenants slow whole stretches of a run by up to 1.8x, and the fastest batch
// is the one they disturbed least. The peak loop is timed the same way, so the shares
// of it compare like with like.
double seconds_per_call(double budget, const std::function<void()>& f) {
  f();
  const auto t0 = Clock::now();
  f();
  const double one = std::chrono::duration<double>(Clock::now() - t0).count();
  const int per_batch = std::max(1, static_cast<int>(0.005 / std::max(one, 1e-9)));
  double best = 1e30, elapsed = 0;
  const auto start = Clock::now();
  do {
    const auto b0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - b0).count() / per_batch);
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < budget);
  return best;
}

// FMA peak: 24 independent accumulators, no memory traffic.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float fma_loop_avx512(long iters) {
  __m512 acc[24];
#pragma GCC unroll 24
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(a, acc[i], b);
  }
  float s = 0;
  for (int i = 0; i < 24; ++i) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}
__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) {
  __m256 acc[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(a, acc[i], b);
  }
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(out, s);
  return out[0];
}
#endif

// C written alone, as the GEMM's tiles write it (a column sliver at a time, every row),
// with the path's vector stores and no multiply-adds: for a product with a short K the
// time its stores take by themselves (printed beside the GEMM's time; see main).
#if defined(__x86_64__)
__attribute__((target("avx512f"))) void store_c_avx512(float* c, int m, int n) {
  const __m512 v = _mm512_set1_ps(1.0f);
  for (int j = 0; j + 32 <= n; j += 32)
    for (int i = 0; i < m; ++i) {
      _mm512_storeu_ps(c + static_cast<long>(i) * n + j, v);
      _mm512_storeu_ps(c + static_cast<long>(i) * n + j + 16, v);
    }
}
__attribute__((target("avx2"))) void store_c_avx2(float* c, int m, int n) {
  const __m256 v = _mm256_set1_ps(1.0f);
  for (int j = 0; j + 16 <= n; j += 16)
    for (int i = 0; i < m; ++i) {
      _mm256_storeu_ps(c + static_cast<long>(i) * n + j, v);
      _mm256_storeu_ps(c + static_cast<long>(i) * n + j + 8, v);
    }
}
#endif

double store_c_seconds(CpuKernels path, float* c, int m, int n, double budget) {
#if defined(__x86_64__)
  if (path == CpuKernels::Avx512) return seconds_per_call(budget, [&] { store_c_avx512(c, m, n); });
  if (path == CpuKernels::Avx2) return seconds_per_call(budget, [&] { store_c_avx2(c, m, n); });
#endif
  (void)c, (void)m, (void)n, (void)budget, (void)path;
  return 0;
}

double peak_gflops(CpuKernels path, double budget) {
  volatile float sink = 0;
  const long iters = 20000;  // about 0.25 ms a call
#if defined(__x86_64__)
  if (path == CpuKernels::Avx512)
    return 24.0 * 16 * 2 * iters / seconds_per_call(budget, [&] { sink = sink + fma_loop_avx512(iters); }) / 1e9;
  if (path == CpuKernels::Avx2)
    return 12.0 * 8 * 2 * iters / seconds_per_call(budget, [&] { sink = sink + fma_loop_avx2(iters); }) / 1e9;
#endif
  (void)sink;
  return 0;  // the portable path: no vector peak of its own to compare with
}

// 64-byte aligned floats, as kernels/cpu/scratch.cpp gives the step's products.
struct AlignedFloats {
  explicit AlignedFloats(std::size_t n)
      : p(static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64)))) {
    std::fill(p, p + n, 0.0f);
  }
  ~AlignedFloats() { ::operator delete[](p, std::align_val_t(64)); }
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  float* data() { return p; }
  float* p;
};

struct Shape {
  const char* what;
  Trans ta, tb;
  int m, n, k;
  ChainStart start;  // the forwards start each chain from the bias
};

// A convolution of the model at batch 128 (configs/mnist.json): conv1 1 -> 32 channels
// on 28 x 28, conv2 32 -> 64 on 14 x 14, 3 x 3, padding 1.
ConvShape conv_shape(int layer) {
  ConvShape s;
  s.n = 8, s.c = layer == 1 ? 1 : 32, s.h = s.w = layer == 1 ? 28 : 14;
  s.k = layer == 1 ? 32 : 64, s.r = s.s = 3, s.pad = 1;
  return s;
}

// The operands of one shape as the step passes them (kernels/cpu/conv.cpp, linear.cpp):
// the convolutions' patches read from padded images, dy as image rows; dense matrices
// for the linear layer. `dense` holds the same products as stored matrices, for
// OpenBLAS (which has no implicit form).
struct Operands {
  std::vector<float> x, padded, w, dy;
  Operand a, b;
};

Operands step_operands(const Shape& s, std::vector<float>& dense_a, std::vector<float>& dense_b) {
  Operands o;
  const int a_cols = s.ta == Trans::No ? s.k : s.m, b_cols = s.tb == Trans::No ? s.n : s.k;
  o.a = Operand::dense(s.ta, dense_a.data(), a_cols);
  o.b = Operand::dense(s.tb, dense_b.data(), b_cols);
  const std::string what = s.what;
  if (what.rfind("conv", 0) != 0) {
    // Row lengths as in the step: x's and W's rows are 3136 long.
    if (what == "fc1 dW" || what == "fc1 dX") {  // a block of x_c's columns; half of W's
      o.x.assign(static_cast<std::size_t>(s.k) * 3136, 0.25f);
      o.b = Operand::dense(Trans::No, o.x.data(), 3136);
    }
    return o;
  }
  const int layer = what[4] - '0';
  ConvShape cs = conv_shape(layer);
  const bool dw = what.find("dW") != std::string::npos, dx = what.find("dX") != std::string::npos;
  const int images = dw ? 16 : 8;  // the weight gradient per chunk, the others per sub-batch
  const int64_t ohw = static_cast<int64_t>(cs.out_h()) * cs.out_w();
  o.x.assign(static_cast<std::size_t>(images) * cs.c * cs.h * cs.w, 0.5f);
  o.padded.assign(padded_images_floats(cs, images), 0.0f);
  o.w.assign(static_cast<std::size_t>(cs.k) * cs.c * cs.r * cs.s, 0.25f);
  o.dy.assign(static_cast<std::size_t>(images) * cs.k * ohw, 0.125f);
  const PaddedImages im = pad_images(cs, o.x.data(), images, o.padded.data());
  const int crs = cs.c * cs.r * cs.s;
  if (dw) {  // dW^T[CRS, K] = P * dy^T
    o.a = Operand::patches(Trans::No, im, PatchColumns::Pixels);
    o.b = Operand::image_rows(Trans::Yes, o.dy.data(), cs.k, ohw);
  } else if (dx) {  // col[CRS, nb*OHW] = W^T * dy
    o.a = Operand::dense(Trans::Yes, o.w.data(), crs);
    o.b = Operand::image_rows(Trans::No, o.dy.data(), cs.k, ohw);
  } else {  // out[K, nb*OH*Wp] = b + W * P at the padded width
    o.a = Operand::dense(Trans::No, o.w.data(), crs);
    o.b = Operand::patches(Trans::No, im, PatchColumns::PaddedRows);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const double budget = argc > 1 ? std::atof(argv[1]) : 0.3;
  const std::string only = argc > 2 ? argv[2] : "";
  // The calls kernels/cpu/conv.cpp and linear.cpp make at batch 128, with the operands
  // they pass (step_operands): the convolutions' forward per sub-batch of 8 images at
  // the padded width, their weight gradients per chunk of 16 images with the taps as
  // rows, the data gradient per sub-batch; fc1's forward and data gradient per thread's
  // half of the columns (2 threads), its weight gradient per chunk and block of 64
  // input columns.
  const Shape shapes[] = {
      {"conv1 forward", Trans::No, Trans::No, 32, 8 * 28 * 30, 9, ChainStart::RowValues},
      {"conv1 dW", Trans::No, Trans::Yes, 9, 32, 16 * 784, ChainStart::Zero},
      {"conv2 forward", Trans::No, Trans::No, 64, 8 * 14 * 16, 288, ChainStart::RowValues},
      {"conv2 dW", Trans::No, Trans::Yes, 288, 64, 16 * 196, ChainStart::Zero},
      {"conv2 dX", Trans::Yes, Trans::No, 288, 1568, 64, ChainStart::Zero},
      {"fc1 forward", Trans::No, Trans::Yes, 128, 64, 3136, ChainStart::ColumnValues},
      {"fc1 dW", Trans::Yes, Trans::No, 128, 64, 16, ChainStart::Zero},
      {"fc1 dX", Trans::No, Trans::No, 128, 1568, 128, ChainStart::Zero},
  };
  std::vector<CpuKernels> paths;
  for (CpuKernels p : {CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Portable})
    if (cpu_supports(p)) paths.push_back(p);
#if defined(ENGINE_BENCH_OPENBLAS)
  openblas_set_num_threads(1);
#endif
  // The peak loop runs again before each shape and the fastest of its runs is the
  // peak: one slow stretch of the VM during a single peak run would inflate every share.
  std::vector<double> peak(paths.size(), 0.0);
  struct Row {
    const Shape* shape;
    std::vector<double> gflops;  // per path, then OpenBLAS where built
    std::vector<double> c_alone;  // per path: C's stores alone, seconds per call
  };
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    if (std::string(s.what).rfind(only, 0) != 0) continue;
    for (std::size_t i = 0; i < paths.size(); ++i) peak[i] = std::max(peak[i], peak_gflops(paths[i], budget / 2));
    const int a_rows = s.ta == Trans::No ? s.m : s.k, a_cols = s.ta == Trans::No ? s.k : s.m;
    const int b_rows = s.tb == Trans::No ? s.k : s.n, b_cols = s.tb == Trans::No ? s.n : s.k;
    std::vector<float> a(static_cast<std::size_t>(a_rows) * a_cols, 0.5f), b(static_cast<std::size_t>(b_rows) * b_cols, 0.25f),
        bias(static_cast<std::size_t>(std::max(s.m, s.n)), 0.125f);
    AlignedFloats c(static_cast<std::size_t>(s.m) * s.n);  // as the step's scratch (kernels/cpu/scratch.cpp)
    const double flop = 2.0 * s.m * s.n * s.k;
    Row row{&s, {}};
    const Operands ops = step_operands(s, a, b);
    // The data gradient's GEMM is told of final columns, as the step's (its col2im
    // follows them), which changes its blocking: a no-op here.
    ColumnsDone done;
    if (std::string(s.what).find("dX") != std::string::npos && std::string(s.what).rfind("conv", 0) == 0)
      done.call = [](void*, int) {};
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const double t = seconds_per_call(budget, [&] {
        gemm_with(paths[i], s.m, s.n, s.k, ops.a, ops.b, s.start, bias.data(), c.data(), s.n, done);
      });
      row.gflops.push_back(flop / t / 1e9);
      row.c_alone.push_back(store_c_seconds(paths[i], c.data(), s.m, s.n, budget / 2));
    }
#if defined(ENGINE_BENCH_OPENBLAS)
    const double t = seconds_per_call(budget, [&] {
      cblas_sgemm(CblasRowMajor, s.ta == Trans::No ? CblasNoTrans : CblasTrans, s.tb == Trans::No ? CblasNoTrans : CblasTrans,
                  s.m, s.n, s.k, 1.0f, a.data(), a_cols, b.data(), b_cols, s.start == ChainStart::Zero ? 0.0f : 1.0f,
                  c.data(), s.n);
    });
    row.gflops.push_back(flop / t / 1e9);
#endif
    rows.push_back(row);
  }
  std::printf("one thread; GFLOP/s (%% of the path's FMA peak; OpenBLAS: of the first path's)\n");
  std::printf("%-14s %-16s", "shape", "M x N x K");
  for (CpuKernels p : paths) std::printf(" %18s", cpu_kernels_name(p));
#if defined(ENGINE_BENCH_OPENBLAS)
  std::printf(" %18s", "OpenBLAS");
#endif
  std::printf("\n%-14s %-16s", "FMA peak", "");
  for (double pk : peak) pk > 0 ? std::printf(" %18.1f", pk) : std::printf(" %18s", "-");
  std::printf("\n");
  for (const Row& row : rows) {
    char dims[32];
    std::snprintf(dims, sizeof dims, "%dx%dx%d", row.shape->m, row.shape->n, row.shape->k);
    std::printf("%-14s %-16s", row.shape->what, dims);
    for (std::size_t i = 0; i < row.gflops.size(); ++i) {
      const double pk = i < peak.size() ? peak[i] : (peak.empty() ? 0.0 : peak[0]);
      if (pk > 0) std::printf(" %10.1f (%3.0f%%)", row.gflops[i], 100.0 * row.gflops[i] / pk);
      else std::printf(" %18.1f", row.gflops[i]);
    }
    std::printf("\n");
  }
  // Where each vector path's time goes at a short K: C's stores alone and the
  // multiply-adds alone at peak, each as a share of the GEMM's time. Near 100 % together
  // with the GEMM at their sum, the two do not overlap (docs/benchmarks.md, "The engine's
  // own GEMM").
  std::printf("\nshare of the GEMM's time: C's stores alone + the multiply-adds alone at peak\n");
  for (const Row& row : rows) {
    std::printf("%-14s %-16s", row.shape->what, "");
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const double gemm_s = 2.0 * row.shape->m * row.shape->n * row.shape->k / (row.gflops[i] * 1e9);
      if (peak[i] <= 0 || row.c_alone[i] <= 0) {
        std::printf(" %18s", "-");
        continue;
      }
      const double fma_s = 2.0 * row.shape->m * row.shape->n * row.shape->k / (peak[i] * 1e9);
      std::printf("      %3.0f%% + %3.0f%%", 100.0 * row.c_alone[i] / gemm_s, 100.0 * fma_s / gemm_s);
    }
    std::printf("\n");
  }
  return 0;
}
