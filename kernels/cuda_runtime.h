// The small slice of the CUDA runtime the engine core needs (memory, copies, sync),
// behind plain C++ declarations so no CUDA header leaks out. Implemented in
// kernels/cuda/runtime.cpp for CUDA builds and kernels/no_cuda.cpp otherwise.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace engine::kernels::cuda {

bool built();
int device_count();
// Human description of the GPU (name, memory), or "" when none.
std::string device_name(int index);
void set_device(int index);
void* alloc(std::size_t bytes);
void free(void* p);
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind);
void memset_zero(void* p, std::size_t bytes);
void synchronize();
// Page-locked host memory, for device-to-host copies that need not wait one by one: the
// async save's snapshot buffer (engine/run/run_directory_writer.cpp).
void* alloc_pinned_host(std::size_t bytes);
void free_pinned_host(void* p);
// Queues a copy from device memory into pinned host memory on the compute stream, after
// the work already queued there, and returns at once. What is queued behind it on that
// stream (the next step's kernels) cannot change its source before it has read it.
void copy_to_pinned_host_async(void* dst, const void* src, std::size_t bytes);
// Queues a copy from pinned host memory into device memory on the compute stream and
// returns at once: the per-step values' upload (engine/core/step_values.cpp), which
// leaves `src` unchanged until a mark after the copy has passed.
void copy_from_pinned_host_async(void* dst, const void* src, std::size_t bytes);
// A mark on the compute stream after everything queued so far (a CUDA event), which any
// thread may wait for: the async save's writer waits for its copies, the training thread
// queues the next step at once.
using StreamMark = std::shared_ptr<void>;
StreamMark mark_stream();
// Blocks (sleeping, not spinning) until the work before `mark` is done; null: returns.
void wait_for(const StreamMark& mark);
// CUDA graphs of the compute stream (the training step, engine/train/trainer_step.cpp).
// Between begin_capture and end_capture, what this thread queues on the compute stream is
// recorded, not run; end_capture returns the recording, instantiated, for launch() to
// replay (each replay reads its buffers and the per-step values at the addresses they
// had in the capture). abandon_capture ends a capture that failed half-way, keeping
// nothing.
using Graph = std::shared_ptr<void>;
void begin_capture();
Graph end_capture();
void abandon_capture();
void launch(const Graph& graph);
// The compute stream every op runs on, as a cudaStream_t (for NCCL, which must order
// its exchanges on it: engine/core/collective/nccl_collective.cpp). Defined in kernels/cuda/chunk_ops.cu.
void* compute_stream();

// Versions for engine/core/build_info.cpp (`engine --version`); all empty in CPU-only builds.
// Works without a GPU or a driver (those give an empty `driver`, zero devices).
struct BackendVersions {
  std::string runtime;  // CUDA runtime compiled against (CUDART_VERSION), e.g. "13.0"
  std::string cudnn;    // cudnnGetVersion() and CUDNN_VERSION, e.g. "9.13.0 (headers 9.13.0)"
  std::string cublas;   // cublasGetProperty() and the header's CUBLAS_VER_*
  std::string driver;   // cudaDriverGetVersion(): the CUDA version the driver supports
};
BackendVersions backend_versions();

}  // namespace engine::kernels::cuda
