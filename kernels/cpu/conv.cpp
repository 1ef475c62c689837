// Fast CPU convolution: im2col + single-threaded sgemm per image, images spread over
// OpenMP threads. Weight/bias gradients are summed per fixed chunk of images, then
// the chunks in order, so the bits do not depend on the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/ops.h"

namespace engine::kernels::cpu {

namespace {

// col[(c*R + r)*S + q][oh*OW + ow] = x[c, oh + r - pad, ow + q - pad] (0 outside).
void im2col(const ConvShape& s, const float* x, float* col) {
  const int oh_n = s.out_h(), ow_n = s.out_w();
  for (int c = 0; c < s.c; ++c)
    for (int r = 0; r < s.r; ++r)
      for (int q = 0; q < s.s; ++q) {
        float* row = col + static_cast<int64_t>((c * s.r + r) * s.s + q) * oh_n * ow_n;
        for (int oh = 0; oh < oh_n; ++oh) {
          const int ih = oh + r - s.pad;
          float* out = row + oh * ow_n;
          if (ih < 0 || ih >= s.h) {
            std::memset(out, 0, sizeof(float) * ow_n);
            continue;
          }
          const float* in = x + (static_cast<int64_t>(c) * s.h + ih) * s.w;
          for (int ow = 0; ow < ow_n; ++ow) {
            const int iw = ow + q - s.pad;
            out[ow] = (iw >= 0 && iw < s.w) ? in[iw] : 0.0f;
          }
        }
      }
}

// The adjoint of im2col: dx[c, ih, iw] = sum of the col entries that read it.
void col2im(const ConvShape& s, const float* col, float* dx) {
  const int oh_n = s.out_h(), ow_n = s.out_w();
  std::memset(dx, 0, sizeof(float) * s.c * s.h * s.w);
  for (int c = 0; c < s.c; ++c)
    for (int r = 0; r < s.r; ++r)
      for (int q = 0; q < s.s; ++q) {
        const float* row = col + static_cast<int64_t>((c * s.r + r) * s.s + q) * oh_n * ow_n;
        for (int oh = 0; oh < oh_n; ++oh) {
          const int ih = oh + r - s.pad;
          if (ih < 0 || ih >= s.h) continue;
          float* out = dx + (static_cast<int64_t>(c) * s.h + ih) * s.w;
          for (int ow = 0; ow < ow_n; ++ow) {
            const int iw = ow + q - s.pad;
            if (iw >= 0 && iw < s.w) out[iw] += row[oh * ow_n + ow];
          }
        }
      }
}

int64_t col_size(const ConvShape& s) {
  return static_cast<int64_t>(s.c) * s.r * s.s * s.out_h() * s.out_w();
}

}  // namespace

void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b, float* y) {
  blas_single_threaded();
  const int ohw = s.out_h() * s.out_w();
  const int crs = s.c * s.r * s.s;
#pragma omp parallel
  {
    std::vector<float> col(static_cast<std::size_t>(col_size(s)));
#pragma omp for schedule(static)
    for (int n = 0; n < s.n; ++n) {
      im2col(s, x + static_cast<int64_t>(n) * s.c * s.h * s.w, col.data());
      float* yn = y + static_cast<int64_t>(n) * s.k * ohw;
      for (int k = 0; k < s.k; ++k) std::fill(yn + k * ohw, yn + (k + 1) * ohw, b ? b[k] : 0.0f);
      // y_n[K, OHW] += W[K, CRS] * col[CRS, OHW]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.k, ohw, crs, 1.0f, w, crs,
                  col.data(), ohw, 1.0f, yn, ohw);
    }
  }
}

void conv2d_backward(const ConvShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  blas_single_threaded();
  const int ohw = s.out_h() * s.out_w();
  const int crs = s.c * s.r * s.s;
  const int64_t wsize = static_cast<int64_t>(s.k) * crs;
  std::vector<float> dw_chunks(static_cast<std::size_t>(kBatchChunks * wsize), 0.0f);
  std::vector<double> db_chunks(static_cast<std::size_t>(kBatchChunks) * s.k, 0.0);
#pragma omp parallel
  {
    std::vector<float> col(static_cast<std::size_t>(col_size(s)));
#pragma omp for schedule(static)
    for (int chunk = 0; chunk < kBatchChunks; ++chunk) {
      const int n0 = static_cast<int>(static_cast<int64_t>(s.n) * chunk / kBatchChunks);
      const int n1 = static_cast<int>(static_cast<int64_t>(s.n) * (chunk + 1) / kBatchChunks);
      float* dw_c = dw_chunks.data() + chunk * wsize;
      double* db_c = db_chunks.data() + static_cast<int64_t>(chunk) * s.k;
      for (int n = n0; n < n1; ++n) {
        const float* xn = x + static_cast<int64_t>(n) * s.c * s.h * s.w;
        const float* dyn = dy + static_cast<int64_t>(n) * s.k * ohw;
        im2col(s, xn, col.data());
        // dW[K, CRS] += dy_n[K, OHW] * col^T[OHW, CRS]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.k, crs, ohw, 1.0f, dyn, ohw,
                    col.data(), ohw, 1.0f, dw_c, crs);
        for (int k = 0; k < s.k; ++k) {
          double acc = 0.0;
          for (int i = 0; i < ohw; ++i) acc += dyn[k * ohw + i];
          db_c[k] += acc;
        }
        if (dx) {
          // col[CRS, OHW] = W^T[CRS, K] * dy_n[K, OHW]
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, crs, ohw, s.k, 1.0f, w, crs, dyn,
                      ohw, 0.0f, col.data(), ohw);
          col2im(s, col.data(), dx + static_cast<int64_t>(n) * s.c * s.h * s.w);
        }
      }
    }
  }
  for (int64_t i = 0; i < wsize; ++i) {
    float acc = 0.0f;
    for (int chunk = 0; chunk < kBatchChunks; ++chunk) acc += dw_chunks[chunk * wsize + i];
    dw[i] = acc;
  }
  if (db)
    for (int k = 0; k < s.k; ++k) {
      double acc = 0.0;
      for (int chunk = 0; chunk < kBatchChunks; ++chunk) acc += db_chunks[chunk * s.k + k];
      db[k] = static_cast<float>(acc);
    }
}

}  // namespace engine::kernels::cpu
