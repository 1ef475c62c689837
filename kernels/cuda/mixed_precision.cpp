// Mixed-precision convolution and linear ops (see mixed_precision.h for the contract).
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
// Algorithm choice mirrors conv_cudnn.cpp: deterministic mode takes the first result of
// cuDNN's heuristics that cuDNN reports as deterministic; otherwise cudnnFind's fastest.
// Unlike the fp32 path, tensor-core results are accepted. The math type each chosen
// result reports is set on that direction's own convolution descriptor, as cuDNN asks.
// Plans live in this file's cache, keyed by shape and the deterministic setting, apart
// from the context's fp32 plans.
//
// Memory: the fp16 copies of the inputs and outputs live in one scratch buffer owned by
// this file (grown on demand, stream-ordered like every allocation of the context);
// the cuDNN workspace is the context's. All work runs on the context's one stream, so
// each op may reuse the scratch as soon as the previous op's work was queued.
#include "kernels/cuda/mixed_precision.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/settings.h"

namespace engine::kernels::cuda {

namespace {

constexpr std::size_t kHalfBytes = 2;  // IEEE binary16
// Same cap as the fp32 convolutions: algorithms asking for more scratch are skipped.
constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;
// Each fp16 buffer starts on this boundary (cuBLAS and cuDNN tensor-core kernels want
// at least 16-byte aligned operands).
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
std::size_t half_bytes(int64_t count) { return static_cast<std::size_t>(count) * kHalfBytes; }

// ---- Scratch for fp16 copies ---------------------------------------------------------

// One device buffer, grown (never shrunk) to the largest request. Leaked at exit like
// the context itself, for the same reason (see context.h).
class Scratch {
 public:
  void* get(std::size_t bytes) {
    if (bytes > bytes_) {
      Context& ctx = Context::get();
      ctx.release(ptr_);  // stream-ordered: queued work using it finishes first
      ptr_ = nullptr;
      bytes_ = 0;
      const std::size_t mib = std::size_t{1} << 20;
      const std::size_t rounded = (bytes + mib - 1) / mib * mib;
      ptr_ = ctx.allocate(rounded);
      bytes_ = rounded;
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

Scratch& scratch() {
  static Scratch* s = new Scratch();
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

// ---- fp16 convolution plans ----------------------------------------------------------

struct HalfConvPlan {
  cudnnTensorDescriptor_t x = nullptr;  // [n, c, h, w] half
  cudnnTensorDescriptor_t y = nullptr;  // [n, k, out_h, out_w] half
  cudnnFilterDescriptor_t w = nullptr;  // [k, c, r, s] half
  // One convolution descriptor per direction: each carries the math type its chosen
  // algorithm was reported with.
  cudnnConvolutionDescriptor_t fwd_conv = nullptr;
  cudnnConvolutionDescriptor_t bwd_data_conv = nullptr;
  cudnnConvolutionDescriptor_t bwd_filter_conv = nullptr;

  bool fwd_chosen = false;
  cudnnConvolutionFwdAlgo_t fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  std::size_t fwd_workspace = 0;

  bool bwd_data_chosen = false;
  cudnnConvolutionBwdDataAlgo_t bwd_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  std::size_t bwd_data_workspace = 0;

  bool bwd_filter_chosen = false;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  std::size_t bwd_filter_workspace = 0;

  HalfConvPlan() = default;
  HalfConvPlan(const HalfConvPlan&) = delete;
  HalfConvPlan& operator=(const HalfConvPlan&) = delete;
  ~HalfConvPlan() {
    // Errors ignored, as in ConvPlan's destructor.
    if (bwd_filter_conv) cudnnDestroyConvolutionDescriptor(bwd_filter_conv);
    if (bwd_data_conv) cudnnDestroyConvolutionDescriptor(bwd_data_conv);
    if (fwd_conv) cudnnDestroyConvolutionDescriptor(fwd_conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

void make_conv_descriptor(cudnnConvolutionDescriptor_t* conv, const ConvShape& s) {
  ENGINE_CUDA_CHECK(cudnnCreateConvolutionDescriptor(conv));
  // Cross-correlation, stride 1, no dilation; FLOAT compute type with HALF tensors is
  // cuDNN's PSEUDO_HALF configuration (fp32 accumulation).
  ENGINE_CUDA_CHECK(cudnnSetConvolution2dDescriptor(*conv, s.pad, s.pad, 1, 1, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  ENGINE_CUDA_CHECK(cudnnSetConvolutionMathType(*conv, CUDNN_TENSOR_OP_MATH));
}

// Not locked: one host thread drives the GPU (as for the context's plan cache).
HalfConvPlan& half_plan(const ConvShape& s, bool deterministic) {
  using Key = std::tuple<int, int, int, int, int, int, int, int, bool>;
  // Leaked like the context: destroying descriptors during static destruction buys
  // nothing.
  static auto* plans = new std::map<Key, std::unique_ptr<HalfConvPlan>>();
  const Key key{s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.pad, deterministic};
  auto it = plans->find(key);
  if (it != plans->end()) return *it->second;

  auto plan = std::make_unique<HalfConvPlan>();
  ENGINE_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  ENGINE_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  ENGINE_CUDA_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  ENGINE_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, s.n,
                                               s.c, s.h, s.w));
  ENGINE_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, s.n,
                                               s.k, s.out_h(), s.out_w()));
  ENGINE_CUDA_CHECK(cudnnSetFilter4dDescriptor(plan->w, CUDNN_DATA_HALF, CUDNN_TENSOR_NCHW, s.k,
                                               s.c, s.r, s.s));
  make_conv_descriptor(&plan->fwd_conv, s);
  make_conv_descriptor(&plan->bwd_data_conv, s);
  make_conv_descriptor(&plan->bwd_filter_conv, s);

  HalfConvPlan& ref = *plan;
  plans->emplace(key, std::move(plan));
  return ref;
}

std::string shape_text(const ConvShape& s) {
  return "fp16 n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) +
         " h=" + std::to_string(s.h) + " w=" + std::to_string(s.w) + " k=" + std::to_string(s.k) +
         " r=" + std::to_string(s.r) + " s=" + std::to_string(s.s) +
         " pad=" + std::to_string(s.pad);
}

// Index of the first acceptable result (results come best first), or -1. Same rules as
// the fp32 path except that tensor-core math is welcome here.
template <typename Perf>
int first_usable(const std::vector<Perf>& perf, int returned, bool deterministic) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[static_cast<std::size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (p.memory > kMaxWorkspace) continue;
    return i;
  }
  return -1;
}

void check_with_shape(cudnnStatus_t st, const char* call, const ConvShape& s, int line) {
  if (st != CUDNN_STATUS_SUCCESS)
    check(st, (std::string(call) + " for " + shape_text(s)).c_str(), __FILE__, line);
}

void choose_forward(cudnnHandle_t h, HalfConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        h, plan.x, plan.w, plan.fwd_conv, plan.y, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(
        h, plan.x, plan.w, plan.fwd_conv, plan.y, max_count, &returned, perf.data()));
  const int i = first_usable(perf, returned, det);
  if (i >= 0) {
    const cudnnConvolutionFwdAlgoPerf_t& p = perf[static_cast<std::size_t>(i)];
    plan.fwd_algo = p.algo;
    ENGINE_CUDA_CHECK(cudnnSetConvolutionMathType(plan.fwd_conv, p.mathType));
  } else {
    // Implicit GEMM is deterministic and supports every stride-1 PSEUDO_HALF shape.
    plan.fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  }
  check_with_shape(cudnnGetConvolutionForwardWorkspaceSize(h, plan.x, plan.w, plan.fwd_conv,
                                                           plan.y, plan.fwd_algo,
                                                           &plan.fwd_workspace),
                   "cudnnGetConvolutionForwardWorkspaceSize", s, __LINE__);
  plan.fwd_chosen = true;
}

void choose_backward_data(cudnnHandle_t h, HalfConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, plan.w, plan.y, plan.bwd_data_conv, plan.x, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
        h, plan.w, plan.y, plan.bwd_data_conv, plan.x, max_count, &returned, perf.data()));
  const int i = first_usable(perf, returned, det);
  if (i >= 0) {
    const cudnnConvolutionBwdDataAlgoPerf_t& p = perf[static_cast<std::size_t>(i)];
    plan.bwd_data_algo = p.algo;
    ENGINE_CUDA_CHECK(cudnnSetConvolutionMathType(plan.bwd_data_conv, p.mathType));
  } else {
    // ALGO_1: deterministic, general purpose (ALGO_0 uses atomics).
    plan.bwd_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  }
  check_with_shape(cudnnGetConvolutionBackwardDataWorkspaceSize(
                       h, plan.w, plan.y, plan.bwd_data_conv, plan.x, plan.bwd_data_algo,
                       &plan.bwd_data_workspace),
                   "cudnnGetConvolutionBackwardDataWorkspaceSize", s, __LINE__);
  plan.bwd_data_chosen = true;
}

void choose_backward_filter(cudnnHandle_t h, HalfConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, plan.x, plan.y, plan.bwd_filter_conv, plan.w, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
        h, plan.x, plan.y, plan.bwd_filter_conv, plan.w, max_count, &returned, perf.data()));
  const int i = first_usable(perf, returned, det);
  if (i >= 0) {
    const cudnnConvolutionBwdFilterAlgoPerf_t& p = perf[static_cast<std::size_t>(i)];
    plan.bwd_filter_algo = p.algo;
    ENGINE_CUDA_CHECK(cudnnSetConvolutionMathType(plan.bwd_filter_conv, p.mathType));
  } else {
    // ALGO_1: deterministic, general purpose (ALGO_0 and ALGO_3 use atomics).
    plan.bwd_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  }
  check_with_shape(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                       h, plan.x, plan.y, plan.bwd_filter_conv, plan.w, plan.bwd_filter_algo,
                       &plan.bwd_filter_workspace),
                   "cudnnGetConvolutionBackwardFilterWorkspaceSize", s, __LINE__);
  plan.bwd_filter_chosen = true;
}

bool empty(const ConvShape& s) {
  return s.n <= 0 || s.c <= 0 || s.k <= 0 || s.out_h() <= 0 || s.out_w() <= 0;
}

int64_t x_count(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.c * s.h * s.w; }
int64_t w_count(const ConvShape& s) { return static_cast<int64_t>(s.k) * s.c * s.r * s.s; }
int64_t y_hw(const ConvShape& s) { return static_cast<int64_t>(s.out_h()) * s.out_w(); }
int64_t y_count(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.k * y_hw(s); }

// C (fp32, column-major m x n, ld ldc) = op(A) * op(B) with fp16 A and B, fp32
// accumulation; C is overwritten (beta = 0).
void gemm_f16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              const void* a, int lda, const void* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  ENGINE_CUDA_CHECK(cublasGemmEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb,
                                 &zero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// ---- Convolution ---------------------------------------------------------------------

void conv2d_forward_f16(const ConvShape& s, const float* x, const float* w, const float* b,
                        float* y) {
  if (empty(s)) return;
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  HalfConvPlan& plan = half_plan(s, det);
  if (!plan.fwd_chosen) choose_forward(h, plan, s, det);

  const int64_t nx = x_count(s), nw = w_count(s), ny = y_count(s);
  Carver carve(scratch().get(aligned(half_bytes(nx)) + aligned(half_bytes(nw)) +
                             aligned(half_bytes(ny))));
  void* x16 = carve.take(half_bytes(nx));
  void* w16 = carve.take(half_bytes(nw));
  void* y16 = carve.take(half_bytes(ny));
  cast_f32_to_f16(nx, x, x16);
  cast_f32_to_f16(nw, w, w16);

  const float one = 1.0f, zero = 0.0f;  // y = 1 * conv(x, w) + 0 * y: overwrite
  void* ws = ctx.workspace(plan.fwd_workspace);
  ENGINE_CUDA_CHECK(cudnnConvolutionForward(h, &one, plan.x, x16, plan.w, w16, plan.fwd_conv,
                                            plan.fwd_algo, ws, plan.fwd_workspace, &zero, plan.y,
                                            y16));
  cast_f16_to_f32(ny, y16, y);
  if (b) add_channel_bias(s.n, s.k, y_hw(s), b, y);  // fp32, after widening
}

void conv2d_backward_f16(const ConvShape& s, const float* x, const float* w, const float* dy,
                         float* dx, float* dw, float* db) {
  if (empty(s)) return;
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  HalfConvPlan& plan = half_plan(s, det);
  const float one = 1.0f, zero = 0.0f;  // beta = 0: gradients overwrite, never accumulate

  if (dx || dw) {
    if (dx && !plan.bwd_data_chosen) choose_backward_data(h, plan, s, det);
    if (dw && !plan.bwd_filter_chosen) choose_backward_filter(h, plan, s, det);
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
      void* ws = ctx.workspace(plan.bwd_data_workspace);
      ENGINE_CUDA_CHECK(cudnnConvolutionBackwardData(h, &one, plan.w, w16, plan.y, dy16,
                                                     plan.bwd_data_conv, plan.bwd_data_algo, ws,
                                                     plan.bwd_data_workspace, &zero, plan.x,
                                                     dx16));
      cast_f16_to_f32(nx, dx16, dx);
    }
    if (dw) {
      void* x16 = carve.take(half_bytes(nx));
      void* dw16 = carve.take(half_bytes(nw));
      cast_f32_to_f16(nx, x, x16);
      void* ws = ctx.workspace(plan.bwd_filter_workspace);
      ENGINE_CUDA_CHECK(cudnnConvolutionBackwardFilter(h, &one, plan.x, x16, plan.y, dy16,
                                                       plan.bwd_filter_conv, plan.bwd_filter_algo,
                                                       ws, plan.bwd_filter_workspace, &zero,
                                                       plan.w, dw16));
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
