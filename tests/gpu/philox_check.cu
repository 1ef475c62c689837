// Test support for tests/gpu/philox_check.h: one thread per (seed, subsequence,
// offset) triple. Speed is irrelevant here; clarity is the point.
#include <curand_kernel.h>

#include <cstdint>

#include "engine/kernels/philox.h"
#include "gpu/philox_check.h"
#include "kernels/cuda/context.h"

namespace gpu_test {

using engine::PhiloxStream;
using engine::philox_at;
using engine::kernels::cuda::Context;

namespace {

__global__ void philox_values_kernel(int count, const uint64_t* seeds,
                                     const uint64_t* subsequences, const uint64_t* offsets,
                                     uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  out[i] = philox_at(PhiloxStream{seeds[i], subsequences[i]}, offsets[i]);
}

__global__ void curand_values_kernel(int count, const uint64_t* seeds,
                                     const uint64_t* subsequences, const uint64_t* offsets,
                                     uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  curandStatePhilox4_32_10_t state;
  curand_init(seeds[i], subsequences[i], offsets[i], &state);
  out[i] = curand(&state);
}

using Kernel = void (*)(int, const uint64_t*, const uint64_t*, const uint64_t*, uint32_t*);

// Copies the triples in, runs `kernel`, copies the values out; waits for completion.
void run(Kernel kernel, int count, const uint64_t* seeds, const uint64_t* subsequences,
         const uint64_t* offsets, uint32_t* out) {
  if (count <= 0) return;
  Context& ctx = Context::get();
  const std::size_t in_bytes = static_cast<std::size_t>(count) * sizeof(uint64_t);
  const std::size_t out_bytes = static_cast<std::size_t>(count) * sizeof(uint32_t);
  auto* d_seeds = static_cast<uint64_t*>(ctx.allocate(in_bytes));
  auto* d_subsequences = static_cast<uint64_t*>(ctx.allocate(in_bytes));
  auto* d_offsets = static_cast<uint64_t*>(ctx.allocate(in_bytes));
  auto* d_out = static_cast<uint32_t*>(ctx.allocate(out_bytes));
  cudaStream_t st = ctx.stream();
  ENGINE_CUDA_CHECK(cudaMemcpyAsync(d_seeds, seeds, in_bytes, cudaMemcpyHostToDevice, st));
  ENGINE_CUDA_CHECK(
      cudaMemcpyAsync(d_subsequences, subsequences, in_bytes, cudaMemcpyHostToDevice, st));
  ENGINE_CUDA_CHECK(cudaMemcpyAsync(d_offsets, offsets, in_bytes, cudaMemcpyHostToDevice, st));
  const int threads = 128;
  kernel<<<(count + threads - 1) / threads, threads, 0, st>>>(count, d_seeds, d_subsequences,
                                                              d_offsets, d_out);
  ENGINE_CUDA_CHECK_LAUNCH("philox check kernel");
  ENGINE_CUDA_CHECK(cudaMemcpyAsync(out, d_out, out_bytes, cudaMemcpyDeviceToHost, st));
  ENGINE_CUDA_CHECK(cudaStreamSynchronize(st));
  ctx.release(d_seeds);
  ctx.release(d_subsequences);
  ctx.release(d_offsets);
  ctx.release(d_out);
}

}  // namespace

void philox_device_values(int count, const uint64_t* seeds, const uint64_t* subsequences,
                          const uint64_t* offsets, uint32_t* out) {
  run(philox_values_kernel, count, seeds, subsequences, offsets, out);
}

void curand_reference_values(int count, const uint64_t* seeds, const uint64_t* subsequences,
                             const uint64_t* offsets, uint32_t* out) {
  run(curand_values_kernel, count, seeds, subsequences, offsets, out);
}

}  // namespace gpu_test
