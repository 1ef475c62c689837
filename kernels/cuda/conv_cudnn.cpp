// Convolutions through cuDNN's (legacy, still supported in cuDNN 9) convolution API.
// The bias is added and reduced by our own kernels (kernels/cuda/elementwise_ops.cu),
// whose order is fixed and documented.
//
// Algorithm choice, once per shape (cached in the context's ConvPlan):
//  * deterministic mode (default): cuDNN's heuristics (cudnnGet*Algorithm_v7), keeping
//    only algorithms cuDNN reports as CUDNN_DETERMINISTIC. Heuristics depend only on
//    the shape and the GPU, not on timing, so the choice is the same on every run;
//    cudnnFind* times the candidates and can pick differently from run to run.
//  * otherwise: cudnnFind*Algorithm, the fastest measured algorithm.
// In both modes tensor-core (TF32) algorithms are excluded: the descriptors ask for
// CUDNN_FMA_MATH, and results reporting a tensor-op math type are skipped.
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/cuda/context.h"
#include "kernels/cuda/settings.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

namespace {

// Algorithms needing more scratch than this are passed over (FFT variants can ask for
// gigabytes); the fallbacks below need little or none.
constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;

std::string shape_text(const ConvShape& s) {
  return "n=" + std::to_string(s.n) + " c=" + std::to_string(s.c) + " h=" + std::to_string(s.h) +
         " w=" + std::to_string(s.w) + " k=" + std::to_string(s.k) + " r=" + std::to_string(s.r) +
         " s=" + std::to_string(s.s) + " pad=" + std::to_string(s.pad);
}

// Index of the first acceptable result (results come best first), or -1.
template <typename Perf>
int first_usable(const std::vector<Perf>& perf, int returned, bool deterministic) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[static_cast<std::size_t>(i)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
      continue;
    if (p.memory > kMaxWorkspace) continue;
    return i;
  }
  return -1;
}

void choose_forward(cudnnHandle_t h, ConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, plan.x, plan.w, plan.conv, plan.y,
                                                             max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(h, plan.x, plan.w, plan.conv, plan.y,
                                                           max_count, &returned, perf.data()));
  const int i = first_usable(perf, returned, det);
  // Implicit GEMM is deterministic and supports every stride-1 shape.
  plan.fwd_algo = i >= 0 ? perf[static_cast<std::size_t>(i)].algo
                         : CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  const cudnnStatus_t st = cudnnGetConvolutionForwardWorkspaceSize(
      h, plan.x, plan.w, plan.conv, plan.y, plan.fwd_algo, &plan.fwd_workspace);
  if (st != CUDNN_STATUS_SUCCESS)
    check(st, ("cudnnGetConvolutionForwardWorkspaceSize for " + shape_text(s)).c_str(), __FILE__,
          __LINE__);
  plan.fwd_chosen = true;
}

void choose_backward_data(cudnnHandle_t h, ConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, plan.w, plan.y, plan.conv, plan.x, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
        h, plan.w, plan.y, plan.conv, plan.x, max_count, &returned, perf.data()));
  const int i = first_usable(perf, returned, det);
  // ALGO_1 is the deterministic general-purpose backward-data algorithm (ALGO_0 uses
  // atomics).
  plan.bwd_data_algo = i >= 0 ? perf[static_cast<std::size_t>(i)].algo
                              : CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  const cudnnStatus_t st = cudnnGetConvolutionBackwardDataWorkspaceSize(
      h, plan.w, plan.y, plan.conv, plan.x, plan.bwd_data_algo, &plan.bwd_data_workspace);
  if (st != CUDNN_STATUS_SUCCESS)
    check(st, ("cudnnGetConvolutionBackwardDataWorkspaceSize for " + shape_text(s)).c_str(),
          __FILE__, __LINE__);
  plan.bwd_data_chosen = true;
}

void choose_backward_filter(cudnnHandle_t h, ConvPlan& plan, const ConvShape& s, bool det) {
  int max_count = 0, returned = 0;
  ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count));
  if (det)
    ENGINE_CUDA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, plan.x, plan.y, plan.conv, plan.w, max_count, &returned, perf.data()));
  else
    ENGINE_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
        h, plan.x, plan.y, plan.conv, plan.w, max_count, &returned, perf.data()));
  const int i = first_usable(perf, returned, det);
  // ALGO_1 is the deterministic general-purpose backward-filter algorithm (ALGO_0 and
  // ALGO_3 use atomics).
  plan.bwd_filter_algo = i >= 0 ? perf[static_cast<std::size_t>(i)].algo
                                : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
  const cudnnStatus_t st = cudnnGetConvolutionBackwardFilterWorkspaceSize(
      h, plan.x, plan.y, plan.conv, plan.w, plan.bwd_filter_algo, &plan.bwd_filter_workspace);
  if (st != CUDNN_STATUS_SUCCESS)
    check(st, ("cudnnGetConvolutionBackwardFilterWorkspaceSize for " + shape_text(s)).c_str(),
          __FILE__, __LINE__);
  plan.bwd_filter_chosen = true;
}

bool empty(const ConvShape& s) {
  return s.n <= 0 || s.c <= 0 || s.k <= 0 || s.out_h() <= 0 || s.out_w() <= 0;
}

}  // namespace

void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                    float* y) {
  if (empty(s)) return;
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  ConvPlan& plan = ctx.conv_plan(s, det);
  if (!plan.fwd_chosen) choose_forward(h, plan, s, det);

  const float one = 1.0f, zero = 0.0f;  // y = 1 * conv(x, w) + 0 * y: overwrite
  void* ws = ctx.workspace(plan.fwd_workspace);
  ENGINE_CUDA_CHECK(cudnnConvolutionForward(h, &one, plan.x, x, plan.w, w, plan.conv,
                                            plan.fwd_algo, ws, plan.fwd_workspace, &zero, plan.y,
                                            y));
  if (b) add_channel_bias(s.n, s.k, static_cast<int64_t>(s.out_h()) * s.out_w(), b, y);
}

void conv2d_backward(const ConvShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  if (empty(s)) return;
  Context& ctx = Context::get();
  cudnnHandle_t h = ctx.cudnn();
  const bool det = deterministic();
  ConvPlan& plan = ctx.conv_plan(s, det);
  const float one = 1.0f, zero = 0.0f;  // beta = 0: gradients overwrite, never accumulate

  if (dx) {  // null for the first layer: its input gradient is not needed
    if (!plan.bwd_data_chosen) choose_backward_data(h, plan, s, det);
    void* ws = ctx.workspace(plan.bwd_data_workspace);
    ENGINE_CUDA_CHECK(cudnnConvolutionBackwardData(h, &one, plan.w, w, plan.y, dy, plan.conv,
                                                   plan.bwd_data_algo, ws,
                                                   plan.bwd_data_workspace, &zero, plan.x, dx));
  }
  if (dw) {
    if (!plan.bwd_filter_chosen) choose_backward_filter(h, plan, s, det);
    void* ws = ctx.workspace(plan.bwd_filter_workspace);
    ENGINE_CUDA_CHECK(cudnnConvolutionBackwardFilter(h, &one, plan.x, x, plan.y, dy, plan.conv,
                                                     plan.bwd_filter_algo, ws,
                                                     plan.bwd_filter_workspace, &zero, plan.w,
                                                     dw));
  }
  if (db) channel_sum(s.n, s.k, static_cast<int64_t>(s.out_h()) * s.out_w(), dy, db);
}

}  // namespace engine::kernels::cuda
