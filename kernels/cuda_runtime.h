// The small slice of the CUDA runtime the engine core needs (memory, copies, sync),
// behind plain C++ declarations so no CUDA header leaks out. Implemented in
// kernels/cuda/runtime.cpp for CUDA builds and kernels/no_cuda.cpp otherwise.
#pragma once
#include <cstddef>
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

}  // namespace engine::kernels::cuda
