// Fully connected layers through cuBLAS's Sgemm (kernels/cuda/cublas_library.h). Bias add and bias gradient use our own
// kernels (kernels/cuda/elementwise_ops.cu; the gradient is a fixed-order sum).
//
// Layout bridge: our tensors are row-major, cuBLAS is column-major. A row-major
// [rows, cols] matrix is, byte for byte, the column-major matrix of its transpose
// [cols, rows] with leading dimension cols. So with x [n, in], w [out, in], y [n, out]
// (row-major) cuBLAS sees x^T [in, n] (ld in), w^T [in, out] (ld in), y^T [out, n]
// (ld out), and each product below is written for those transposes.
#include "kernels/cuda/context.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/fp32_layer_ops.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

void linear_forward_fp32(const LinearShape& s, const float* x, const float* w, const float* b,
                         float* y) {
  if (s.n <= 0 || s.out <= 0) return;
  const SharedStateLock lock;  // the cuBLAS handle (context.h, Threading)
  Context& ctx = Context::get();
  if (s.in <= 0) {  // empty product (cuBLAS rejects ld 0): y is the bias alone
    ENGINE_CUDA_CHECK(cudaMemsetAsync(y, 0, sizeof(float) * s.n * s.out, ctx.stream()));
    if (b) add_channel_bias(s.n, s.out, 1, b, y);
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  // y = x w^T  <=>  y^T [out, n] = w [out, in] * x^T [in, n].
  // cuBLAS holds w^T (ld in), so A = op_T(w^T) = w; B = x^T as stored (op_N, ld in).
  ENGINE_CUDA_CHECK(cublas_library().sgemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, s.out, s.n, s.in, &one, w,
                                s.in, x, s.in, &zero, y, s.out));
  // A [n, out] tensor is [n, c=out, hw=1] for the channel helper.
  if (b) add_channel_bias(s.n, s.out, 1, b, y);
}

void linear_backward_fp32(const LinearShape& s, const float* x, const float* w, const float* dy,
                          float* dx, float* dw, float* db) {
  if (s.n <= 0 || s.out <= 0) return;
  const SharedStateLock lock;  // the cuBLAS handle (context.h, Threading)
  Context& ctx = Context::get();
  // db[j] = sum over samples of dy[i, j]: dy as [n, c=out, hw=1].
  if (db) channel_sum(s.n, s.out, 1, dy, db);
  if (s.in <= 0) return;  // dx and dw are empty

  cublasHandle_t h = ctx.cublas();
  const float one = 1.0f, zero = 0.0f;  // beta = 0: gradients overwrite
  if (dx) {
    // dx = dy w  <=>  dx^T [in, n] = w^T [in, out] * dy^T [out, n]; both are stored
    // as such (ld in and ld out), so no transposes.
    ENGINE_CUDA_CHECK(cublas_library().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, s.in, s.n, s.out, &one, w, s.in, dy,
                                  s.out, &zero, dx, s.in));
  }
  if (dw) {
    // dw = dy^T x  <=>  dw^T [in, out] = x^T [in, n] * dy [n, out]. x^T is stored
    // (ld in); dy is stored as dy^T (ld out), so it is transposed.
    ENGINE_CUDA_CHECK(cublas_library().sgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, s.in, s.out, s.n, &one, x, s.in, dy,
                                  s.out, &zero, dw, s.in));
  }
}

}  // namespace engine::kernels::cuda
