// The block-wide sum of the CUDA reductions, in the fixed tree order of
// kernels/cuda/reduction_order.h. Device code: included by .cu files only.
#pragma once

namespace engine::kernels::cuda {

// Sum of one value per thread over the block, in a fixed tree order: the same inputs
// always give the same bits. `buffer` holds blockDim.x doubles (a power of two).
// Every thread receives the total.
__device__ inline double block_sum(double value, double* buffer) {
  const int t = threadIdx.x;
  buffer[t] = value;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (t < half) buffer[t] += buffer[t + half];
    __syncthreads();
  }
  const double total = buffer[0];
  __syncthreads();  // all threads have read buffer[0] before anyone reuses the buffer
  return total;
}

}  // namespace engine::kernels::cuda
