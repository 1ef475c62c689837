// The CUDA runtime slice the engine core uses (kernels/cuda_runtime.h). Every call
// goes through the context's single stream so that copies, kernels and library calls
// are ordered without extra synchronisation.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cuda/context.h"
#include "kernels/cuda_runtime.h"

namespace engine::kernels::cuda {

bool built() { return true; }

int device_count() {
  int count = 0;
  // No driver or no GPU is an ordinary situation here (CPU machines running a CUDA
  // build), not an error: report zero devices.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so later checks do not see it
    return 0;
  }
  return count;
}

std::string device_name(int index) {
  cudaDeviceProp prop;
  if (index < 0 || index >= device_count() ||
      cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  char text[400];
  std::snprintf(text, sizeof(text), "%s (%.1f GiB, compute capability %d.%d)", prop.name,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
                prop.major, prop.minor);
  return text;
}

void set_device(int index) {
  // The context (stream, handles, memory pool) belongs to one device; switching
  // devices under it would make every later launch fail obscurely.
  if (const Context* c = Context::existing(); c && c->device() != index)
    throw std::runtime_error("the CUDA backend drives one GPU per process: cuda:" +
                             std::to_string(c->device()) + " is in use, cuda:" +
                             std::to_string(index) + " was requested");
  ENGINE_CUDA_CHECK(cudaSetDevice(index));
}

void* alloc(std::size_t bytes) { return Context::get().allocate(bytes); }

void free(void* p) {
  if (!p) return;
  // Only a context that exists can own memory; at exit it still exists (never destroyed).
  if (Context* c = Context::existing()) c->release(p);
}

void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  Context& ctx = Context::get();
  cudaMemcpyKind k = cudaMemcpyDeviceToDevice;
  if (kind == CopyKind::HostToDevice) k = cudaMemcpyHostToDevice;
  if (kind == CopyKind::DeviceToHost) k = cudaMemcpyDeviceToHost;
  ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, ctx.stream()));
  // Host memory is the caller's ordinary (pageable) memory, which it may read or free
  // as soon as we return: wait for copies that touch it. Device-to-device copies stay
  // asynchronous; the stream orders them before any later work.
  if (kind != CopyKind::DeviceToDevice) ENGINE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
}

void memset_zero(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  ENGINE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, Context::get().stream()));
}

void* alloc_pinned_host(std::size_t bytes) {
  Context::get();  // the device is chosen before the memory is registered with it
  void* p = nullptr;
  ENGINE_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
  return p;
}

void free_pinned_host(void* p) {
  if (p) (void)cudaFreeHost(p);  // at exit the runtime may be shutting down: nothing to report
}

void copy_to_pinned_host_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, Context::get().stream()));
}

void copy_from_pinned_host_async(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  ENGINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, Context::get().stream()));
}

StreamMark mark_stream() {
  cudaEvent_t event = nullptr;
  // Blocking sync: the waiting writer thread sleeps instead of spinning on a core that
  // training may need.
  ENGINE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  StreamMark mark(event, [](void* e) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  ENGINE_CUDA_CHECK(cudaEventRecord(event, Context::get().stream()));
  return mark;
}

void wait_for(const StreamMark& mark) {
  if (mark) ENGINE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(mark.get())));
}

void begin_capture() {
  // Thread-local: the async save's writer thread may copy on its own while this thread
  // captures the step.
  ENGINE_CUDA_CHECK(cudaStreamBeginCapture(Context::get().stream(), cudaStreamCaptureModeThreadLocal));
}

Graph end_capture() {
  cudaGraph_t graph = nullptr;
  ENGINE_CUDA_CHECK(cudaStreamEndCapture(Context::get().stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  ENGINE_CUDA_CHECK(made);
  return Graph(exec, [](void* g) { (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g)); });
}

void abandon_capture() {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(Context::get().stream(), &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // an invalidated capture leaves its error behind: not the next op's
}

void launch(const Graph& graph) {
  ENGINE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.get()), Context::get().stream()));
}

void synchronize() {
  // Nothing can be queued before the context exists; do not create it (or touch the
  // driver) just to wait for nothing.
  if (!Context::existing()) return;
  ENGINE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace engine::kernels::cuda
