// Mixed-precision (fp16) convolution and linear ops of the CUDA backend, the way
// PyTorch autocast runs them: inputs rounded to fp16, products on tensor cores with
// fp32 accumulation. Same signatures and contracts as the fp32 ops (
// kernels/op_list.inc): fp32 device pointers in and out, backward overwrites, null
// dx/bias/db allowed); the fp16 copies live in scratch memory owned by this file.
//
// Precision of each result:
//  * conv2d: x, w and dy are rounded to fp16; cuDNN runs with fp16 tensors and fp32
//    compute (PSEUDO_HALF), so y, dx and dw are fp16 values (as in PyTorch autocast)
//    widened to fp32. A result beyond the fp16 range is +-inf, never clamped.
//  * linear: x, w and dy are rounded to fp16; cuBLAS multiplies them with fp32
//    accumulation and writes fp32 directly, so y, dx and dw carry no fp16 output
//    rounding (and no fp16 range limit on the result).
//  * both: an input beyond the fp16 range (a loss-scaled dy that overflows) becomes
//    inf before the product, so the result holds inf or NaN for the loss scaler.
//  * bias add and bias gradient stay fp32 (the fp32 ops' fixed-order kernels).
//
// Data and compute types:
//  * convolutions: cuDNN's legacy API in its PSEUDO_HALF configuration: x, w and y
//    (and dx, dw, dy) descriptors CUDNN_DATA_HALF, convolution compute type
//    CUDNN_DATA_FLOAT (fp32 accumulation), math type CUDNN_TENSOR_OP_MATH (tensor
//    cores allowed, no down-conversion needed: the data is fp16 already). cuDNN has no
//    half-in/float-out configuration, so results come out fp16 and are widened here.
//  * GEMMs: cublasGemmEx with CUDA_R_16F A and B, CUDA_R_32F C, CUBLAS_COMPUTE_32F
//    (tensor cores with fp32 accumulation; the context's CUBLAS_DEFAULT_MATH permits
//    them for fp16 inputs) and CUBLAS_GEMM_DEFAULT.
//
// Descriptors, plan cache and algorithm choice are conv_cudnn.cpp's, shared with the
// fp32 convolutions (ConvData::Half plans: tensor-core algorithms accepted, each
// direction run with the math type its chosen result reports).
//
// Memory: the fp16 copies of the inputs and outputs live in one scratch buffer owned by
// this file (grown on demand, never freed); the cuDNN workspace is the context's. All
// work runs on the context's one stream, so each op may reuse the scratch as soon as
// the previous op's work was queued; SharedStateLock keeps other threads' ops out
// until then.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

namespace {

constexpr std::size_t kHalfBytes = 2;  // IEEE binary16
// Each fp16 buffer starts on this boundary (cuBLAS and cuDNN tensor-core kernels want
// at least 16-byte aligned operands).
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
std::size_t half_bytes(int64_t count) { return static_cast<std::size_t>(count) * kHalfBytes; }

// ---- Scratch for fp16 copies ---------------------------------------------------------

// One device buffer for the fp16 copies, grown to the largest request and never freed
// (PersistentBuffer: a captured graph may hold its address). Leaked at exit like the
// context itself, for the same reason (see context.h). Used under SharedStateLock.
PersistentBuffer& scratch() {
  static auto* s = new PersistentBuffer("fp16 scratch");
  return *s;
}

// Hands out consecutive aligned pieces of a scratch buffer sized by the caller as the
// sum of aligned() of the pieces.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(std::size_t bytes) {
    void* p = base_ + used_;
    used_ += aligned(bytes);
    return p;
  }

 private:
  char* base_;
  std::size_t used_ = 0;
};

int64_t x_count(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.c * s.h * s.w; }
int64_t w_count(const ConvShape& s) { return static_cast<int64_t>(s.k) * s.c * s.r * s.s; }
int64_t y_hw(const ConvShape& s) { return static_cast<int64_t>(s.out_h()) * s.out_w(); }
int64_t y_count(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.k * y_hw(s); }

// C (fp32, column-major m x n, ld ldc) = op(A) * op(B) with fp16 A and B, fp32
// accumulation; C is overwritten (beta = 0).
void gemm_f16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              const void* a, int lda, const void* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  ENGINE_CUDA_CHECK(cublas_library().gemm_ex(h, ta, tb, m, n, k, &one, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb,
                                 &zero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// ---- Convolution ---------------------------------------------------------------------

void conv2d_forward_f16(const ConvShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  if (conv_is_empty(s)) return;
  const SharedStateLock lock;  // scratch, handles (context.h, Threading)
  const int64_t nx = x_count(s), nw = w_count(s), ny = y_count(s);
  Carver carve(scratch().get(aligned(half_bytes(nx)) + aligned(half_bytes(nw)) +
                             aligned(half_bytes(ny))));
  void* x16 = carve.take(half_bytes(nx));
  void* w16 = carve.take(half_bytes(nw));
  void* y16 = carve.take(half_bytes(ny));
  cast_f32_to_f16(nx, x, x16);
  cast_f32_to_f16(nw, w, w16);
  cudnn_conv_forward(s, ConvData::Half, x16, w16, y16);
  cast_f16_to_f32(ny, y16, y);
  if (b) add_channel_bias(s.n, s.k, y_hw(s), b, y);  // fp32, after widening
}

void conv2d_backward_f16(const ConvShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  if (conv_is_empty(s)) return;
  const SharedStateLock lock;  // scratch, handles (context.h, Threading)
  if (dx || dw) {
    const int64_t nx = x_count(s), nw = w_count(s), ny = y_count(s);
    // dy16 always; w16 and dx16 for dx; x16 and dw16 for dw.
    std::size_t total = aligned(half_bytes(ny));
    if (dx) total += aligned(half_bytes(nw)) + aligned(half_bytes(nx));
    if (dw) total += aligned(half_bytes(nx)) + aligned(half_bytes(nw));
    Carver carve(scratch().get(total));
    void* dy16 = carve.take(half_bytes(ny));
    // A dy beyond the fp16 range (a loss scale too large) becomes inf here, and the
    // products below carry it into dx and dw for the scaler to find.
    cast_f32_to_f16(ny, dy, dy16);

    if (dx) {  // null for the first layer: its input gradient is not needed
      void* w16 = carve.take(half_bytes(nw));
      void* dx16 = carve.take(half_bytes(nx));
      cast_f32_to_f16(nw, w, w16);
      cudnn_conv_backward_data(s, ConvData::Half, w16, dy16, dx16);
      cast_f16_to_f32(nx, dx16, dx);
    }
    if (dw) {
      void* x16 = carve.take(half_bytes(nx));
      void* dw16 = carve.take(half_bytes(nw));
      cast_f32_to_f16(nx, x, x16);
      cudnn_conv_backward_filter(s, ConvData::Half, x16, dy16, dw16);
      cast_f16_to_f32(nw, dw16, dw);
    }
  }
  // Bias gradient from the fp32 dy, as in the fp32 op (fixed-order sum).
  if (db) channel_sum(s.n, s.k, y_hw(s), dy, db);
}

// ---- Linear --------------------------------------------------------------------------
// Layouts as in linear_cublas.cpp: row-major x [n, in], w [out, in], y [n, out] are,
// to column-major cuBLAS, x^T (ld in), w^T (ld in), y^T (ld out).

void linear_forward_f16(const LinearShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  if (s.n <= 0 || s.out <= 0) return;
  const SharedStateLock lock;  // scratch, handles (context.h, Threading)
  Context& ctx = Context::get();
  if (s.in <= 0) {  // empty product (cuBLAS rejects ld 0): y is the bias alone
    ENGINE_CUDA_CHECK(cudaMemsetAsync(y, 0, sizeof(float) * s.n * s.out, ctx.stream()));
    if (b) add_channel_bias(s.n, s.out, 1, b, y);
    return;
  }
  const int64_t nx = static_cast<int64_t>(s.n) * s.in, nw = static_cast<int64_t>(s.out) * s.in;
  Carver carve(scratch().get(aligned(half_bytes(nx)) + aligned(half_bytes(nw))));
  void* x16 = carve.take(half_bytes(nx));
  void* w16 = carve.take(half_bytes(nw));
  cast_f32_to_f16(nx, x, x16);
  cast_f32_to_f16(nw, w, w16);
  // y^T [out, n] = w [out, in] * x^T [in, n]: A = op_T(w^T), B = x^T.
  gemm_f16(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, s.out, s.n, s.in, w16, s.in, x16, s.in, y,
           s.out);
  if (b) add_channel_bias(s.n, s.out, 1, b, y);
}

void linear_backward_f16(const LinearShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  if (s.n <= 0 || s.out <= 0) return;
  const SharedStateLock lock;  // scratch, handles (context.h, Threading)
  Context& ctx = Context::get();
  if (db) channel_sum(s.n, s.out, 1, dy, db);  // fp32 dy, fixed-order sum
  if (s.in <= 0 || (!dx && !dw)) return;       // dx and dw are empty or not wanted

  const int64_t nx = static_cast<int64_t>(s.n) * s.in, nw = static_cast<int64_t>(s.out) * s.in;
  const int64_t ny = static_cast<int64_t>(s.n) * s.out;
  std::size_t total = aligned(half_bytes(ny));
  if (dx) total += aligned(half_bytes(nw));
  if (dw) total += aligned(half_bytes(nx));
  Carver carve(scratch().get(total));
  void* dy16 = carve.take(half_bytes(ny));
  cast_f32_to_f16(ny, dy, dy16);  // overflow -> inf, carried into dx and dw

  cublasHandle_t h = ctx.cublas();
  if (dx) {
    void* w16 = carve.take(half_bytes(nw));
    cast_f32_to_f16(nw, w, w16);
    // dx^T [in, n] = w^T [in, out] * dy^T [out, n].
    gemm_f16(h, CUBLAS_OP_N, CUBLAS_OP_N, s.in, s.n, s.out, w16, s.in, dy16, s.out, dx, s.in);
  }
  if (dw) {
    void* x16 = carve.take(half_bytes(nx));
    cast_f32_to_f16(nx, x, x16);
    // dw^T [in, out] = x^T [in, n] * dy [n, out] (dy stored as dy^T, so transposed).
    gemm_f16(h, CUBLAS_OP_N, CUBLAS_OP_T, s.in, s.out, s.n, x16, s.in, dy16, s.out, dw, s.in);
  }
}

}  // namespace engine::kernels::cuda
