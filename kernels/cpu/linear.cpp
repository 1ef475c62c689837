// Fast CPU linear layer: sgemm over fixed blocks (of batch rows for y and dx, of output
// rows for dW), so every output element comes from the same call on any thread count.

#include "kernels/cpu/blas.h"
#include "kernels/ops.h"

namespace engine::kernels::cpu {

namespace {
int chunk_begin(int n, int chunk) { return static_cast<int>(static_cast<int64_t>(n) * chunk / kBatchChunks); }
}  // namespace

void linear_forward(const LinearShape& s, const float* x, const float* w, const float* b, float* y) {
  blas_single_threaded();
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < kBatchChunks; ++chunk) {
    const int n0 = chunk_begin(s.n, chunk), n1 = chunk_begin(s.n, chunk + 1);
    if (n1 == n0) continue;
    float* yc = y + static_cast<int64_t>(n0) * s.out;
    for (int n = n0; n < n1; ++n)
      for (int o = 0; o < s.out; ++o) y[static_cast<int64_t>(n) * s.out + o] = b ? b[o] : 0.0f;
    // y[rows, OUT] += x[rows, IN] * W^T[IN, OUT]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, s.out, s.in, 1.0f,
                x + static_cast<int64_t>(n0) * s.in, s.in, w, s.in, 1.0f, yc, s.out);
  }
}

void linear_backward(const LinearShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  blas_single_threaded();
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < kBatchChunks; ++chunk) {
    // dW by fixed blocks of output rows, each summed over the whole batch in one GEMM:
    // no partial buffers, and the same calls (hence bits) for any thread count.
    const int o0 = chunk_begin(s.out, chunk), o1 = chunk_begin(s.out, chunk + 1);
    if (o1 > o0)
      // dW[o0:o1, IN] = dy[:, o0:o1]^T[rows, N] * x[N, IN]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, s.in, s.n, 1.0f, dy + o0,
                  s.out, x, s.in, 0.0f, dw + static_cast<int64_t>(o0) * s.in, s.in);
    const int n0 = chunk_begin(s.n, chunk), n1 = chunk_begin(s.n, chunk + 1);
    if (dx && n1 > n0)
      // dx_c[rows, IN] = dy_c[rows, OUT] * W[OUT, IN]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n1 - n0, s.in, s.out, 1.0f,
                  dy + static_cast<int64_t>(n0) * s.out, s.out, w, s.in, 0.0f,
                  dx + static_cast<int64_t>(n0) * s.in, s.in);
  }
  if (db)
    for (int o = 0; o < s.out; ++o) {
      double acc = 0.0;
      for (int n = 0; n < s.n; ++n) acc += dy[static_cast<int64_t>(n) * s.out + o];
      db[o] = static_cast<float>(acc);
    }
}

}  // namespace engine::kernels::cpu
