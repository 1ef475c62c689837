// Convolutions through cuDNN's (legacy, still supported in cuDNN 9) convolution API,
// for fp32, fp16 and bf16 tensors alike (see conv_cudnn.h), and the fp32 conv ops. The bias
// is added and reduced by our own kernels (kernels/cuda/elementwise_ops.cu), whose
// order is fixed and documented.
//
// Algorithm choice, once per shape, element type and deterministic setting (cached in
// that key's ConvPlan):
//  * deterministic mode (default): cuDNN's heuristics (cudnnGet*Algorithm_v7), keeping
//    only algorithms cuDNN reports as CUDNN_DETERMINISTIC. Heuristics depend only on
//    the shape and the GPU, not on timing, so the choice is the same on every run;
//    cudnnFind* times the candidates and can pick differently from run to run.
//  * otherwise: cudnnFind*Algorithm, the fastest measured algorithm.
// fp32 plans exclude tensor-core (TF32) algorithms: the descriptors ask for
// CUDNN_FMA_MATH, and results reporting a tensor-op math type are skipped. fp16 and bf16
// plans welcome them, and each direction's convolution descriptor takes the math type its
// chosen result was reported with, as cuDNN asks.
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/cuda/fp32_layer_ops.h"

#include <stdexcept>
#include "kernels/cuda/conv_algo_choice.h"

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/context.h"
#include "kernels/cuda/settings.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

namespace {

// cuDNN descriptors for one convolution shape and element type, plus the algorithm
// chosen (once) for each direction.
struct ConvPlan {
  ConvData data = ConvData::Float;
  cudnnTensorDescriptor_t x = nullptr;  // [n, c, h, w]
  cudnnTensorDescriptor_t y = nullptr;  // [n, k, out_h, out_w]
  cudnnFilterDescriptor_t w = nullptr;  // [k, c, r, s]
  // One convolution descriptor per direction, so each can carry the math type of its
  // own chosen algorithm (fp16, bf16); in fp32 plans all three stay CUDNN_FMA_MATH.
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

  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    // Destruction errors are ignored: nothing useful can be done about them here.
    if (bwd_filter_conv) cudnnDestroyConvolutionDescriptor(bwd_filter_conv);
    if (bwd_data_conv) cudnnDestroyConvolutionDescriptor(bwd_data_conv);
    if (fwd_conv) cudnnDestroyConvolutionDescriptor(fwd_conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

cudnnDataType_t tensor_type(ConvData data) {
  switch (data) {
    case ConvData::Half: return CUDNN_DATA_HALF;
    case ConvData::BFloat16: return CUDNN_DATA_BFLOAT16;
    case ConvData::Float: break;
  }
  return CUDNN_DATA_FLOAT;
}

const char* type_prefix(ConvData data) {
  switch (data) {
    case ConvData::Half: return "fp16 ";
    case ConvData::BFloat16: return "bf16 ";
    case ConvData::Float: break;
  }
  return "";
}

std::string shape_text(const ConvShape& s, ConvData data) {
  return std::string(type_prefix(data)) + "n=" + std::to_string(s.n) +
         " c=" + std::to_string(s.c) + " h=" + std::to_string(s.h) + " w=" + std::to_string(s.w) +
         " k=" + std::to_string(s.k) + " r=" + std::to_string(s.r) + " s=" + std::to_string(s.s) +
         " pad=" + std::to_string(s.pad);
}

void make_conv_descriptor(cudnnConvolutionDescriptor_t* conv, const ConvShape& s, ConvData data) {
  ENGINE_CUDA_CHECK(cudnnCreateConvolutionDescriptor(conv));
  // Cross-correlation (what deep-learning frameworks call convolution), stride 1, no
  // dilation, fp32 compute (with fp16 or bf16 tensors: PSEUDO_HALF or PSEUDO_BFLOAT16,
  // fp32 accumulation).
  ENGINE_CUDA_CHECK(cudnnSetConvolution2dDescriptor(*conv, s.pad, s.pad, 1, 1, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // fp32: FMA math, plain fp32 kernels only (CUDNN_DEFAULT_MATH would permit TF32
  // tensor cores on Ampere and newer). fp16 and bf16: tensor cores, no down-conversion
  // needed.
  ENGINE_CUDA_CHECK(cudnnSetConvolutionMathType(
      *conv, data == ConvData::Float ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
}

// The caller holds SharedStateLock (context.h, Threading). Leaked like the context:
// destroying descriptors during static destruction buys nothing.
ConvPlan& conv_plan(const ConvShape& s, ConvData data, bool deterministic) {
  // `deterministic` is part of the key so toggling the setting re-plans instead of
  // reusing a choice.
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, bool>;
  static auto* plans = new std::map<Key, std::unique_ptr<ConvPlan>>();
  const Key key{s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.pad, static_cast<int>(data), deterministic};
  auto it = plans->find(key);
  if (it != plans->end()) return *it->second;

  auto plan = std::make_unique<ConvPlan>();
  plan->data = data;
  const cudnnDataType_t type = tensor_type(data);
  ENGINE_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  ENGINE_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  ENGINE_CUDA_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  ENGINE_CUDA_CHECK(
      cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, type, s.n, s.c, s.h, s.w));
  ENGINE_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, type, s.n, s.k,
                                               s.out_h(), s.out_w()));
  ENGINE_CUDA_CHECK(
      cudnnSetFilter4dDescriptor(plan->w, type, CUDNN_TENSOR_NCHW, s.k, s.c, s.r, s.s));
  make_conv_descriptor(&plan->fwd_conv, s, data);
  make_conv_descriptor(&plan->bwd_data_conv, s, data);
  make_conv_descriptor(&plan->bwd_filter_conv, s, data);

  ConvPlan& ref = *plan;
  plans->emplace(key, std::move(plan));
  return ref;
}

// cuDNN's results as the choice rule reads them (kernels/cuda/conv_algo_choice.h).
template <typename Perf>
std::vector<ConvAlgoResult> algo_results(const std::vector<Perf>& perf, int returned) {
  std::vector<ConvAlgoResult> out;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[static_cast<std::size_t>(i)];
    ConvAlgoResult r;
    r.succeeded = p.status == CUDNN_STATUS_SUCCESS;
    r.deterministic = p.determinism == CUDNN_DETERMINISTIC;
    r.tensor_op_math = p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    r.memory = p.memory;
    out.push_back(r);
  }
  return out;
}

// The index of the result to take, or -1 for the direction's fallback; throws the
// refusal (bf16 without a usable result).
template <typename Perf>
int choose(const std::vector<Perf>& perf, int returned, bool deterministic, ConvData data, ConvDirection direction,
           const ConvShape& s) {
  const ConvAlgoChoice c =
      choose_conv_algo(algo_results(perf, returned), deterministic, data, direction, shape_text(s, data));
  if (c.kind == ConvAlgoChoice::Kind::Refused) throw std::runtime_error(c.refusal);
  return c.kind == ConvAlgoChoice::Kind::Result ? c.index : -1;
}

// fp16 and bf16 plans run a direction with the math type its chosen result reports. fp32
// plans keep CUDNN_FMA_MATH: a result reporting CUDNN_DEFAULT_MATH would otherwise let
// TF32 in.
void adopt_math_type(const ConvPlan& plan, cudnnConvolutionDescriptor_t conv,
                     cudnnMathType_t reported) {
  if (plan.data != ConvData::Float) ENGINE_CUDA_CHECK(cudnnSetConvolutionMathType(conv, reported));
}

void check_with_shape(cudnnStatus_t st, const char* call, const ConvShape& s, ConvData data,
                      int line) {
  if (st != CUDNN_STATUS_SUCCESS)
    check(st, (std::string(call) + " for " + shape_text(s, data)).c_str(), __FILE__, line);
}

void choose_forward(cudnnHandle_t h, ConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        h, plan.x, plan.w, plan.fwd_conv, plan.y, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(
        h, plan.x, plan.w, plan.fwd_conv, plan.y, max_count, &returned, perf.data()));
  const int i = choose(perf, returned, det, plan.data, ConvDirection::Forward, s);
  if (i >= 0) {
    const cudnnConvolutionFwdAlgoPerf_t& p = perf[static_cast<std::size_t>(i)];
    plan.fwd_algo = p.algo;
    adopt_math_type(plan, plan.fwd_conv, p.mathType);
  } else {
    // Implicit GEMM is deterministic and supports every stride-1 shape in fp32 and fp16
    // (bf16 refuses instead: kernels/cuda/conv_algo_choice.h).
    plan.fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  }
  check_with_shape(cudnnGetConvolutionForwardWorkspaceSize(h, plan.x, plan.w, plan.fwd_conv,
                                                           plan.y, plan.fwd_algo,
                                                           &plan.fwd_workspace),
                   "cudnnGetConvolutionForwardWorkspaceSize", s, plan.data, __LINE__);
  plan.fwd_chosen = true;
}

void choose_backward_data(cudnnHandle_t h, ConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, plan.w, plan.y, plan.bwd_data_conv, plan.x, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
        h, plan.w, plan.y, plan.bwd_data_conv, plan.x, max_count, &returned, perf.data()));
  const int i = choose(perf, returned, det, plan.data, ConvDirection::BackwardData, s);
  if (i >= 0) {
    const cudnnConvolutionBwdDataAlgoPerf_t& p = perf[static_cast<std::size_t>(i)];
    plan.bwd_data_algo = p.algo;
    adopt_math_type(plan, plan.bwd_data_conv, p.mathType);
  } else {
    // ALGO_1 is the deterministic general-purpose backward-data algorithm (ALGO_0 uses
    // atomics).
    plan.bwd_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  }
  check_with_shape(cudnnGetConvolutionBackwardDataWorkspaceSize(
                       h, plan.w, plan.y, plan.bwd_data_conv, plan.x, plan.bwd_data_algo,
                       &plan.bwd_data_workspace),
                   "cudnnGetConvolutionBackwardDataWorkspaceSize", s, plan.data, __LINE__);
  plan.bwd_data_chosen = true;
}

void choose_backward_filter(cudnnHandle_t h, ConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, plan.x, plan.y, plan.bwd_filter_conv, plan.w, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
        h, plan.x, plan.y, plan.bwd_filter_conv, plan.w, max_count, &returned, perf.data()));
  const int i = choose(perf, returned, det, plan.data, ConvDirection::BackwardFilter, s);
  if (i >= 0) {
    const cudnnConvolutionBwdFilterAlgoPerf_t& p = perf[static_cast<std::size_t>(i)];
    plan.bwd_filter_algo = p.algo;
    adopt_math_type(plan, plan.bwd_filter_conv, p.mathType);
  } else {
    // ALGO_1 is the deterministic general-purpose backward-filter algorithm (ALGO_0 and
    // ALGO_3 use atomics).
    plan.bwd_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  }
  check_with_shape(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                       h, plan.x, plan.y, plan.bwd_filter_conv, plan.w, plan.bwd_filter_algo,
                       &plan.bwd_filter_workspace),
                   "cudnnGetConvolutionBackwardFilterWorkspaceSize", s, plan.data, __LINE__);
  plan.bwd_filter_chosen = true;
}

}  // namespace

bool conv_is_empty(const ConvShape& s) {
  return s.n <= 0 || s.c <= 0 || s.k <= 0 || s.out_h() <= 0 || s.out_w() <= 0;
}

// alpha = 1, beta = 0 throughout: results overwrite, gradients never accumulate. The
// scaling factors are float for fp16 and bf16 tensors too (PSEUDO_HALF, PSEUDO_BFLOAT16).

void cudnn_conv_forward(const ConvShape& s, ConvData data, const void* x, const void* w,
                        void* y) {
  const SharedStateLock lock;  // plan cache, handle, workspace
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  ConvPlan& plan = conv_plan(s, data, det);
  if (!plan.fwd_chosen) choose_forward(h, plan, s, det);
  const float one = 1.0f, zero = 0.0f;
  void* ws = ctx.workspace(plan.fwd_workspace);
  ENGINE_CUDA_CHECK(cudnnConvolutionForward(h, &one, plan.x, x, plan.w, w, plan.fwd_conv,
                                            plan.fwd_algo, ws, plan.fwd_workspace, &zero, plan.y,
                                            y));
}

void cudnn_conv_backward_data(const ConvShape& s, ConvData data, const void* w, const void* dy,
                              void* dx) {
  const SharedStateLock lock;  // plan cache, handle, workspace
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  ConvPlan& plan = conv_plan(s, data, det);
  if (!plan.bwd_data_chosen) choose_backward_data(h, plan, s, det);
  const float one = 1.0f, zero = 0.0f;
  void* ws = ctx.workspace(plan.bwd_data_workspace);
  ENGINE_CUDA_CHECK(cudnnConvolutionBackwardData(h, &one, plan.w, w, plan.y, dy,
                                                 plan.bwd_data_conv, plan.bwd_data_algo, ws,
                                                 plan.bwd_data_workspace, &zero, plan.x, dx));
}

void cudnn_conv_backward_filter(const ConvShape& s, ConvData data, const void* x, const void* dy,
                                void* dw) {
  const SharedStateLock lock;  // plan cache, handle, workspace
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  ConvPlan& plan = conv_plan(s, data, det);
  if (!plan.bwd_filter_chosen) choose_backward_filter(h, plan, s, det);
  const float one = 1.0f, zero = 0.0f;
  void* ws = ctx.workspace(plan.bwd_filter_workspace);
  ENGINE_CUDA_CHECK(cudnnConvolutionBackwardFilter(h, &one, plan.x, x, plan.y, dy,
                                                   plan.bwd_filter_conv, plan.bwd_filter_algo, ws,
                                                   plan.bwd_filter_workspace, &zero, plan.w, dw));
}

// ---- fp32 ops -----------------------------------------------------------------------

void conv2d_forward_fp32(const ConvShape& s, const float* x, const float* w, const float* b,
                         float* y) {
  if (conv_is_empty(s)) return;
  cudnn_conv_forward(s, ConvData::Float, x, w, y);
  if (b) add_channel_bias(s.n, s.k, static_cast<int64_t>(s.out_h()) * s.out_w(), b, y);
}

void conv2d_backward_fp32(const ConvShape& s, const float* x, const float* w, const float* dy,
                          float* dx, float* dw, float* db) {
  if (conv_is_empty(s)) return;
  // dx is null for the first layer: its input gradient is not needed.
  if (dx) cudnn_conv_backward_data(s, ConvData::Float, w, dy, dx);
  if (dw) cudnn_conv_backward_filter(s, ConvData::Float, x, dy, dw);
  if (db) channel_sum(s.n, s.k, static_cast<int64_t>(s.out_h()) * s.out_w(), dy, db);
}

}  // namespace engine::kernels::cuda
