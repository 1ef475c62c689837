// Internal to kernels/cuda: the per-process GPU context (one stream, cuBLAS and cuDNN
// handles, scratch memory), error checking, and launch helpers shared by several op
// files. Includes CUDA headers, so only files
// under kernels/cuda include it; the rest of the engine sees kernels/cuda_runtime.h.
//
// Threading: one host thread drives the GPU. Context::get() itself is thread-safe
// (function-local static), but the workspace (and conv_cudnn.cpp's plan cache) are not
// locked.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace engine::kernels::cuda {

// Each throws std::runtime_error naming the failed call when status is not success.
void check(cudaError_t status, const char* call, const char* file, int line);
void check(cublasStatus_t status, const char* call, const char* file, int line);
void check(cudnnStatus_t status, const char* call, const char* file, int line);

}  // namespace engine::kernels::cuda

#define ENGINE_CUDA_CHECK(call) ::engine::kernels::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration at once. Errors while the
// kernel runs surface at the next synchronising call (copy to host, synchronize()).
#define ENGINE_CUDA_CHECK_LAUNCH(kernel_name) \
  ::engine::kernels::cuda::check(cudaGetLastError(), "launch " kernel_name, __FILE__, __LINE__)

namespace engine::kernels::cuda {

class Context {
 public:
  // The process's context, created on first use on the then-current device. It is
  // deliberately never destroyed: tensors freed during static destruction would
  // otherwise reach a destroyed stream, and the driver reclaims everything at exit.
  static Context& get();
  // The context when it already exists, else null (does not create it).
  static Context* existing();

  int device() const { return device_; }
  // The one stream all work goes to (kernels, copies, cuBLAS, cuDNN). It is a
  // blocking stream, so work on the legacy default stream stays ordered with it.
  cudaStream_t stream() const { return stream_; }

  // Device memory, stream-ordered when the GPU supports memory pools (freed blocks
  // are cached by the pool, so per-step tensors cost no cudaMalloc/cudaFree).
  void* allocate(std::size_t bytes);
  void release(void* p) noexcept;  // ignores errors (called from destructors, at exit)

  cublasHandle_t cublas();  // created on first use, bound to stream()
  cudnnHandle_t cudnn();    // created on first use, bound to stream()

  // Scratch memory of at least `bytes`, valid until the next workspace() call. Since
  // all work is ordered on one stream, an op may use it freely until it returns.
  void* workspace(std::size_t bytes);

 private:
  Context();

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool pools_ = false;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
};

// ---- Launch helpers shared by op files (kernels in elementwise_ops.cu). All run on
// Context::get().stream().

// y[i, ch, j] += bias[ch] for y of shape [n, c, hw].
void add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y);
// out[ch] = sum over i, j of x[i, ch, j] for x of shape [n, c, hw], accumulated in
// double in a fixed order (fixed slices of each channel over many blocks, fixed trees,
// partials added in slice order), so the bits never vary. Uses workspace().
void channel_sum(int n, int c, int64_t hw, const float* x, float* out);

// Blocks for a grid-stride loop over `count` items; capped because every kernel using
// it loops, and a huge grid buys nothing.
inline unsigned int grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  const int64_t cap = int64_t{1} << 16;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

}  // namespace engine::kernels::cuda
