// Fast CPU linear layer: sgemm over fixed chunks of the batch. Rows of y and dx are
// independent; dW and db are summed per chunk, then over chunks in order.
#include <vector>

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
  const int64_t wsize = static_cast<int64_t>(s.out) * s.in;
  std::vector<float> dw_chunks(static_cast<std::size_t>(kBatchChunks * wsize));
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < kBatchChunks; ++chunk) {
    const int n0 = chunk_begin(s.n, chunk), n1 = chunk_begin(s.n, chunk + 1);
    float* dw_c = dw_chunks.data() + chunk * wsize;
    const float* xc = x + static_cast<int64_t>(n0) * s.in;
    const float* dyc = dy + static_cast<int64_t>(n0) * s.out;
    // dW_c[OUT, IN] = dy_c^T[OUT, rows] * x_c[rows, IN]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.out, s.in, n1 - n0, 1.0f, dyc, s.out,
                xc, s.in, 0.0f, dw_c, s.in);
    if (dx && n1 > n0)
      // dx_c[rows, IN] = dy_c[rows, OUT] * W[OUT, IN]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n1 - n0, s.in, s.out, 1.0f, dyc,
                  s.out, w, s.in, 0.0f, dx + static_cast<int64_t>(n0) * s.in, s.in);
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < wsize; ++i) {
    float acc = 0.0f;
    for (int chunk = 0; chunk < kBatchChunks; ++chunk) acc += dw_chunks[chunk * wsize + i];
    dw[i] = acc;
  }
  if (db)
    for (int o = 0; o < s.out; ++o) {
      double acc = 0.0;
      for (int n = 0; n < s.n; ++n) acc += dy[static_cast<int64_t>(n) * s.out + o];
      db[o] = static_cast<float>(acc);
    }
}

}  // namespace engine::kernels::cpu
