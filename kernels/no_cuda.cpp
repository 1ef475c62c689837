// CPU-only builds: the CUDA runtime and ops exist as stubs that explain themselves.
#include <stdexcept>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/settings.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

[[noreturn]] static void unavailable() {
  throw std::runtime_error("this engine was built without CUDA (reconfigure with nvcc available)");
}

bool built() { return false; }
int device_count() { return 0; }
std::string device_name(int) { return ""; }
void set_device(int) { unavailable(); }
void* alloc(std::size_t) { unavailable(); }
void free(void*) {}
void copy(void*, const void*, std::size_t, CopyKind) { unavailable(); }
void memset_zero(void*, std::size_t) { unavailable(); }
void synchronize() {}
void* alloc_pinned_host(std::size_t) { unavailable(); }
void free_pinned_host(void*) {}
void copy_to_pinned_host_async(void*, const void*, std::size_t) { unavailable(); }
void copy_from_pinned_host_async(void*, const void*, std::size_t) { unavailable(); }
void begin_capture() { unavailable(); }
Graph end_capture() { unavailable(); }
void abandon_capture() {}
void launch(const Graph&) { unavailable(); }
StreamMark mark_stream() { unavailable(); }
void wait_for(const StreamMark&) {}
void* compute_stream() { unavailable(); }
BackendVersions backend_versions() { return {}; }

// The deterministic setting is recorded even without CUDA so configs behave the same.
static bool g_deterministic = true;
void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }
static bool g_batch_chunks = false;  // the config default (cuda.batch_chunks)
void set_batch_chunks(bool on) { g_batch_chunks = on; }
bool batch_chunks() { return g_batch_chunks; }
void cast_f32_to_f16(int64_t, const float*, void*) { unavailable(); }
void cast_f16_to_f32(int64_t, const void*, float*) { unavailable(); }
void cast_f32_to_bf16(int64_t, const float*, void*) { unavailable(); }
void cast_bf16_to_f32(int64_t, const void*, float*) { unavailable(); }

// Every op of the op list, each `{ unavailable(); }`.
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) \
  ret name params { unavailable(); }
#include "kernels/op_list.inc"
#undef ENGINE_OP

}  // namespace engine::kernels::cuda
