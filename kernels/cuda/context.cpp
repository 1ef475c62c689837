// The per-process GPU context, error checking, and the backend settings.
#include "kernels/cuda/context.h"

#include "kernels/cuda/cublas_library.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/settings.h"

namespace engine::kernels::cuda {

// ---- Errors -------------------------------------------------------------------------

const char* source_relative(const char* file) {
  if (!file) return "";
  const char* relative = nullptr;
  for (const char* p = std::strstr(file, "kernels/"); p; p = std::strstr(p + 1, "kernels/"))
    if (p == file || p[-1] == '/') relative = p;
  if (relative) return relative;
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

namespace {
[[noreturn]] void fail(const std::string& what, const char* call, const char* file, int line) {
  throw std::runtime_error(what + " in " + call + " (" + source_relative(file) + ":" +
                           std::to_string(line) + ")");
}
}  // namespace

void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  fail(std::string("CUDA error ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status),
       call, file, line);
}

void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(std::string("cuBLAS error: ") + cublas_library().status_string(status), call, file, line);
}

void check(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string what = std::string("cuDNN error: ") + cudnnGetErrorString(status);
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));  // cuDNN 9: why, when it knows
  if (detail[0] != '\0') what += std::string(" (") + detail + ")";
  fail(what, call, file, line);
}

// ---- Settings -----------------------------------------------------------------------

namespace {
// Constant-initialised (no static initialiser runs), read on every conv call.
std::atomic<bool> g_deterministic{true};
}  // namespace

void set_deterministic(bool on) { g_deterministic.store(on); }
bool deterministic() { return g_deterministic.load(); }

// ---- Shared state -------------------------------------------------------------------

namespace {
// Leaked like the context: ops may still run from static destructors.
std::recursive_mutex& shared_state_mutex() {
  static auto* m = new std::recursive_mutex();
  return *m;
}
}  // namespace

SharedStateLock::SharedStateLock() : lock_(shared_state_mutex()) {}
SharedStateLock::~SharedStateLock() = default;

void* PersistentBuffer::get(std::size_t bytes) {
  if (bytes <= bytes_) return ptr_;
  Context& ctx = Context::get();
  if (ctx.capturing())
    throw std::logic_error(std::string("CUDA ") + name_ + " would grow from " +
                           std::to_string(bytes_) + " to " + std::to_string(bytes) +
                           " bytes during graph capture; reserve it in warm-up");
  const std::size_t mib = std::size_t{1} << 20;
  std::size_t grown = (bytes + mib - 1) / mib * mib;
  if (grown < 2 * bytes_) grown = 2 * bytes_;
  void* p = ctx.allocate(grown);
  if (ptr_) retired_.push_back(ptr_);
  ptr_ = p;
  bytes_ = grown;
  return ptr_;
}

// ---- Context ------------------------------------------------------------------------

namespace {
// Set once the context exists; constant-initialised so reading it needs no init.
std::atomic<Context*> g_context{nullptr};
}  // namespace

Context& Context::get() {
  // Leaked on purpose (see the header). If the constructor throws (no GPU), the next
  // call tries again.
  static Context* context = [] {
    Context* c = new Context();
    g_context.store(c);
    return c;
  }();
  return *context;
}

Context* Context::existing() { return g_context.load(); }

Context::Context() {
  ENGINE_CUDA_CHECK(cudaGetDevice(&device_));
  ENGINE_CUDA_CHECK(cudaStreamCreate(&stream_));
  int pools = 0;
  ENGINE_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_));
  pools_ = pools != 0;
  if (pools_) {
    // Keep freed memory in the pool instead of returning it to the driver at every
    // synchronisation: training frees and re-allocates the same sizes every step.
    cudaMemPool_t pool;
    ENGINE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t threshold = UINT64_MAX;
    ENGINE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
}

void* Context::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (pools_)
    ENGINE_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
  else
    ENGINE_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void Context::release(void* p) noexcept {
  if (!p) return;
  // Errors are dropped: this runs from tensor destructors, possibly after the CUDA
  // runtime began shutting down at exit (cudaErrorCudartUnloading).
  const cudaError_t status = pools_ ? cudaFreeAsync(p, stream_) : cudaFree(p);
  if (status != cudaSuccess) (void)cudaGetLastError();  // do not leave it for the next check
}

cublasHandle_t Context::cublas() {
  const SharedStateLock lock;
  if (!cublas_) {
    const CublasLibrary& lib = cublas_library();  // throws, naming the file, when it cannot load
    cublasHandle_t h = nullptr;
    ENGINE_CUDA_CHECK(lib.create(&h));
    // The handle's own workspace, kept for the process's life like the handle: a GEMM
    // under graph capture then allocates nothing (kernels/cuda/cublas_library.h).
    cublas_workspace_.reserve(kCublasWorkspaceBytes);
    bind_cublas_handle(lib, h, stream_, cublas_workspace_.get(kCublasWorkspaceBytes), kCublasWorkspaceBytes);
    cublas_ = h;
  }
  return cublas_;
}

cudnnHandle_t Context::cudnn() {
  const SharedStateLock lock;
  if (!cudnn_) {
    cudnnHandle_t h = nullptr;
    ENGINE_CUDA_CHECK(cudnnCreate(&h));
    ENGINE_CUDA_CHECK(cudnnSetStream(h, stream_));
    cudnn_ = h;
  }
  return cudnn_;
}

void* Context::workspace(std::size_t bytes) {
  const SharedStateLock lock;
  return workspace_.get(bytes);
}

void Context::reserve_workspace(std::size_t bytes) {
  const SharedStateLock lock;
  workspace_.reserve(bytes);
}

bool Context::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ENGINE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace engine::kernels::cuda
