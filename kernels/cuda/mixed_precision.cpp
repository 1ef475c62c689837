// Mixed-precision (fp16 and bf16) convolution and linear ops of the CUDA backend, the
// way PyTorch autocast runs them: inputs rounded to the 16-bit format, products on tensor
// cores with fp32 accumulation. Same signatures and contracts as the fp32 ops (
// kernels/op_list.inc): fp32 device pointers in and out, backward overwrites, null
// dx/bias/db allowed); the 16-bit copies live in scratch memory owned by this file.
// fp16 and bf16 run the same code (a Format, below): only the casts and the types the
// libraries are told differ.
//
// Precision of each result:
//  * conv2d: x, w and dy are rounded to the format; cuDNN runs with 16-bit tensors and
//    fp32 compute (PSEUDO_HALF, PSEUDO_BFLOAT16), so y, dx and dw are values of the
//    format (as in PyTorch autocast) widened to fp32. A result beyond the format's range
//    is +-inf, never clamped.
//  * linear: x, w and dy are rounded to the format; cuBLAS multiplies them with fp32
//    accumulation and writes fp32 directly, so y, dx and dw carry no 16-bit output
//    rounding (and no 16-bit range limit on the result).
//  * both: an input beyond the format's range (a loss-scaled dy that overflows fp16)
//    becomes inf before the product, so the result holds inf or NaN for the loss scaler.
//    bf16 has fp32's range: only what rounds past its largest finite value overflows,
//    and bf16 runs without a loss scaler.
//  * bias add and bias gradient stay fp32 (the fp32 ops' fixed-order kernels).
//
// Data and compute types:
//  * convolutions: cuDNN's legacy API in its PSEUDO_HALF (PSEUDO_BFLOAT16) configuration:
//    x, w and y (and dx, dw, dy) descriptors CUDNN_DATA_HALF (CUDNN_DATA_BFLOAT16),
//    convolution compute type CUDNN_DATA_FLOAT (fp32 accumulation), math type
//    CUDNN_TENSOR_OP_MATH (tensor cores allowed, no down-conversion needed: the data is
//    16-bit already). cuDNN has no 16-bit-in/float-out configuration, so results come
//    out in the format and are widened here. bf16 convolutions need Ampere or newer.
//  * GEMMs: cublasGemmEx with CUDA_R_16F (CUDA_R_16BF) A and B, CUDA_R_32F C,
//    CUBLAS_COMPUTE_32F (tensor cores with fp32 accumulation; the context's
//    CUBLAS_DEFAULT_MATH permits them for 16-bit inputs) and CUBLAS_GEMM_DEFAULT.
//
// Descriptors, plan cache and algorithm choice are conv_cudnn.cpp's, shared with the
// fp32 convolutions (ConvData::Half and ConvData::BFloat16 plans: tensor-core algorithms
// accepted, each direction run with the math type its chosen result reports).
//
// Memory: the 16-bit copies of the inputs and outputs live in one scratch buffer owned by
// this file (grown on demand, never freed); the cuDNN workspace is the context's. All
// work runs on the context's one stream, so each op may reuse the scratch as soon as
// the previous op's work was queued; SharedStateLock keeps other threads' ops out
// until then.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/by_chunks.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/cuda/fp32_layer_ops.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

namespace {

constexpr std::size_t kElementBytes = 2;  // IEEE binary16 and bfloat16 alike
// Each 16-bit buffer starts on this boundary (cuBLAS and cuDNN tensor-core kernels want
// at least 16-byte aligned operands).
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
std::size_t half_bytes(int64_t count) { return static_cast<std::size_t>(count) * kElementBytes; }

// One 16-bit operand format: its casts and the types cuDNN and cuBLAS are told.
struct Format {
  ConvData conv;
  cudaDataType_t gemm;
  void (*narrow)(int64_t n, const float* in, void* out);  // round to the format
  void (*widen)(int64_t n, const void* in, float* out);   // exact
};
const Format kFp16{ConvData::Half, CUDA_R_16F, cast_f32_to_f16, cast_f16_to_f32};
const Format kBf16{ConvData::BFloat16, CUDA_R_16BF, cast_f32_to_bf16, cast_bf16_to_f32};

// ---- Scratch for 16-bit copies ---------------------------------------------------------

// One device buffer for the 16-bit copies, grown to the largest request and never freed
// (PersistentBuffer: a captured graph may hold its address). Leaked at exit like the
// context itself, for the same reason (see context.h). Used under SharedStateLock.
PersistentBuffer& scratch() {
  static auto* s = new PersistentBuffer("16-bit scratch");
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

// C (fp32, column-major m x n, ld ldc) = op(A) * op(B) with A and B in format f, fp32
// accumulation; C is overwritten (beta = 0).
void gemm_16(const Format& f, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
             int k, const void* a, int lda, const void* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  ENGINE_CUDA_CHECK(cublas_library().gemm_ex(h, ta, tb, m, n, k, &one, a, f.gemm, lda, b, f.gemm, ldb,
                                 &zero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

// ---- Convolution ---------------------------------------------------------------------

void conv_forward_16(const Format& f, const ConvShape& s, const float* x, const float* w, const float* b,
                     float* y) {
  if (conv_is_empty(s)) return;
  const SharedStateLock lock;  // scratch, handles (context.h, Threading)
  const int64_t nx = x_count(s), nw = w_count(s), ny = y_count(s);
  Carver carve(scratch().get(aligned(half_bytes(nx)) + aligned(half_bytes(nw)) +
                             aligned(half_bytes(ny))));
  void* x16 = carve.take(half_bytes(nx));
  void* w16 = carve.take(half_bytes(nw));
  void* y16 = carve.take(half_bytes(ny));
  f.narrow(nx, x, x16);
  f.narrow(nw, w, w16);
  cudnn_conv_forward(s, f.conv, x16, w16, y16);
  f.widen(ny, y16, y);
  if (b) add_channel_bias(s.n, s.k, y_hw(s), b, y);  // fp32, after widening
}

void conv_backward_16(const Format& f, const ConvShape& s, const float* x, const float* w, const float* dy,
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
    // A dy beyond the format's range (fp16: a loss scale too large) becomes inf here,
    // and the products below carry it into dx and dw for the scaler to find.
    f.narrow(ny, dy, dy16);

    if (dx) {  // null for the first layer: its input gradient is not needed
      void* w16 = carve.take(half_bytes(nw));
      void* dx16 = carve.take(half_bytes(nx));
      f.narrow(nw, w, w16);
      cudnn_conv_backward_data(s, f.conv, w16, dy16, dx16);
      f.widen(nx, dx16, dx);
    }
    if (dw) {
      void* x16 = carve.take(half_bytes(nx));
      void* dw16 = carve.take(half_bytes(nw));
      f.narrow(nx, x, x16);
      cudnn_conv_backward_filter(s, f.conv, x16, dy16, dw16);
      f.widen(nw, dw16, dw);
    }
  }
  // Bias gradient from the fp32 dy, as in the fp32 op (fixed-order sum).
  if (db) channel_sum(s.n, s.k, y_hw(s), dy, db);
}

// ---- Linear --------------------------------------------------------------------------
// Layouts as in linear_cublas.cpp: row-major x [n, in], w [out, in], y [n, out] are,
// to column-major cuBLAS, x^T (ld in), w^T (ld in), y^T (ld out).

void linear_forward_16(const Format& f, const LinearShape& s, const float* x, const float* w, const float* b,
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
  f.narrow(nx, x, x16);
  f.narrow(nw, w, w16);
  // y^T [out, n] = w [out, in] * x^T [in, n]: A = op_T(w^T), B = x^T.
  gemm_16(f, ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, s.out, s.n, s.in, w16, s.in, x16, s.in, y,
          s.out);
  if (b) add_channel_bias(s.n, s.out, 1, b, y);
}

void linear_backward_16(const Format& f, const LinearShape& s, const float* x, const float* w, const float* dy,
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
  f.narrow(ny, dy, dy16);  // overflow -> inf, carried into dx and dw

  cublasHandle_t h = ctx.cublas();
  if (dx) {
    void* w16 = carve.take(half_bytes(nw));
    f.narrow(nw, w, w16);
    // dx^T [in, n] = w^T [in, out] * dy^T [out, n].
    gemm_16(f, h, CUBLAS_OP_N, CUBLAS_OP_N, s.in, s.n, s.out, w16, s.in, dy16, s.out, dx, s.in);
  }
  if (dw) {
    void* x16 = carve.take(half_bytes(nx));
    f.narrow(nx, x, x16);
    // dw^T [in, out] = x^T [in, n] * dy [n, out] (dy stored as dy^T, so transposed).
    gemm_16(f, h, CUBLAS_OP_N, CUBLAS_OP_T, s.in, s.out, s.n, x16, s.in, dy16, s.out, dw, s.in);
  }
}

}  // namespace

// ---- The ops: the op list's conv and linear in every precision ------------------------

namespace {
const Format& format_of(Precision p) { return p == Precision::Fp16 ? kFp16 : kBf16; }
}  // namespace

void conv2d_forward(const ConvShape& s, Precision p, BatchSplit split, const float* x, const float* w,
                    const float* b, float* y) {
  if (!split.whole()) return conv2d_forward_by_chunks(s, p, split.chunks, split.bounds, x, w, b, y);
  if (p == Precision::Fp32) return conv2d_forward_fp32(s, x, w, b, y);
  conv_forward_16(format_of(p), s, x, w, b, y);
}
void conv2d_backward(const ConvShape& s, Precision p, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db) {
  if (p == Precision::Fp32) return conv2d_backward_fp32(s, x, w, dy, dx, dw, db);
  conv_backward_16(format_of(p), s, x, w, dy, dx, dw, db);
}
void linear_forward(const LinearShape& s, Precision p, BatchSplit split, const float* x, const float* w,
                    const float* b, float* y) {
  if (!split.whole()) return linear_forward_by_chunks(s, p, split.chunks, split.bounds, x, w, b, y);
  if (p == Precision::Fp32) return linear_forward_fp32(s, x, w, b, y);
  linear_forward_16(format_of(p), s, x, w, b, y);
}
void linear_backward(const LinearShape& s, Precision p, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db) {
  if (p == Precision::Fp32) return linear_backward_fp32(s, x, w, dy, dx, dw, db);
  linear_backward_16(format_of(p), s, x, w, dy, dx, dw, db);
}

}  // namespace engine::kernels::cuda
