// fp32 <-> fp16 conversion on the GPU for the mixed-precision path. Plain C++ (no CUDA
// headers): fp16 buffers are passed as void* holding IEEE binary16 values. Pointers
// are device pointers; the kernels run on the backend's stream (kernels/cuda/
// elementwise_ops.cu). Present only in CUDA builds.
#pragma once
#include <cstdint>

namespace engine::kernels::cuda {

// out[i] = fp16(in[i]), rounded to nearest even (overflow gives +-inf).
void cast_f32_to_f16(int64_t n, const float* in, void* out);
// out[i] = float(in[i]) (exact).
void cast_f16_to_f32(int64_t n, const void* in, float* out);

}  // namespace engine::kernels::cuda
