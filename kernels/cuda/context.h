// Internal to kernels/cuda: the per-process GPU context (one stream, cuBLAS and cuDNN
// handles, scratch memory), error checking, and launch helpers shared by several op
// files. Includes CUDA headers, so only files
// under kernels/cuda include it; the rest of the engine sees kernels/cuda_runtime.h.
//
// Threading: any number of host threads may run ops (docs/embedding.md promises that
// Classifier is thread-safe). All work goes to the one stream, so the GPU runs it in
// the order it was queued; what needs a lock is the host-side state that ops share:
// the workspace, the 16-bit scratch (mixed_precision.cpp), the conv plan cache
// (conv_cudnn.cpp) and the cuBLAS/cuDNN handles. An op holds SharedStateLock from its
// first use of that state until its last launch that reads it is queued, so another
// thread's op cannot hand the same workspace to a kernel queued in between.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/ops.h"

namespace engine::kernels::cuda {

// Each throws std::runtime_error naming the failed call when status is not success.
void check(cudaError_t status, const char* call, const char* file, int line);
void check(cublasStatus_t status, const char* call, const char* file, int line);
void check(cudnnStatus_t status, const char* call, const char* file, int line);

// `file` as the messages print it: the part from the last "kernels/" on (a path
// relative to the source root), else the name alone. __FILE__ is the build machine's
// absolute path, which says nothing to the user and leaks the build's layout.
const char* source_relative(const char* file);

}  // namespace engine::kernels::cuda

#define ENGINE_CUDA_CHECK(call) ::engine::kernels::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration at once. Errors while the
// kernel runs surface at the next synchronising call (copy to host, synchronize()).
#define ENGINE_CUDA_CHECK_LAUNCH(kernel_name) \
  ::engine::kernels::cuda::check(cudaGetLastError(), "launch " kernel_name, __FILE__, __LINE__)

namespace engine::kernels::cuda {

// Device memory that only grows and is never freed: a buffer handed out once stays
// valid for the life of the process, so a CUDA graph captured with its address can be
// replayed after any later growth. Growth at least doubles the size (rounded to MiB),
// so the retired buffers together are smaller than the current one. Growing while the
// context's stream is being captured throws std::logic_error (the graph would record a
// new allocation and the replay would run with a buffer of the old size): size it
// first, in warm-up, with reserve(). Callers hold SharedStateLock.
class PersistentBuffer {
 public:
  explicit PersistentBuffer(const char* name) : name_(name) {}
  // A buffer of at least `bytes` (nullptr for 0 before any growth).
  void* get(std::size_t bytes);
  void reserve(std::size_t bytes) { (void)get(bytes); }
  std::size_t capacity() const { return bytes_; }
  std::size_t retired_count() const { return retired_.size(); }

 private:
  const char* name_;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<void*> retired_;  // never freed: a captured graph may still point here
};

// Held by every op that uses the shared host-side state (see "Threading" above).
// Recursive: an op may call another (linear_backward -> channel_sum).
class SharedStateLock {
 public:
  SharedStateLock();
  ~SharedStateLock();
  SharedStateLock(const SharedStateLock&) = delete;
  SharedStateLock& operator=(const SharedStateLock&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

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

  // Created on first use, bound to stream(). Use them under SharedStateLock: a handle
  // must not be used by two threads at once.
  cublasHandle_t cublas();
  cudnnHandle_t cudnn();

  // Scratch memory of at least `bytes`, shared by all ops; the caller holds
  // SharedStateLock until its last launch reading it is queued (the one stream then
  // orders every later user after it). Persistent (see PersistentBuffer).
  void* workspace(std::size_t bytes);
  void reserve_workspace(std::size_t bytes);
  std::size_t workspace_capacity() const { return workspace_.capacity(); }

  // True while stream() is being captured into a CUDA graph.
  bool capturing() const;

 private:
  Context();

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool pools_ = false;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  PersistentBuffer workspace_{"workspace"};
  PersistentBuffer cublas_workspace_{"cuBLAS workspace"};
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
