// fp32 <-> bf16 casts of the bf16 mixed-precision ops (kernels/cuda/mixed_precision.cpp),
// declared in kernels/cuda/cast.h. __float2bfloat16_rn rounds to nearest even, as
// kernels/bf16_math.h does for the reference (NaN payloads aside: CUDA gives its
// canonical NaN); widening is exact.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/context.h"

namespace engine::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(int64_t n, const float* in, __nv_bfloat16* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void bf16_to_f32_kernel(int64_t n, const __nv_bfloat16* in, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

}  // namespace

void cast_f32_to_bf16(int64_t n, const float* in, void* out) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, Context::get().stream()>>>(
      n, in, static_cast<__nv_bfloat16*>(out));
  ENGINE_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

void cast_bf16_to_f32(int64_t n, const void* in, float* out) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, Context::get().stream()>>>(
      n, static_cast<const __nv_bfloat16*>(in), out);
  ENGINE_CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
}

}  // namespace engine::kernels::cuda
