// fp32 <-> fp16 and fp32 <-> bf16 conversion on the GPU for the mixed-precision path.
// Plain C++ (no CUDA headers): fp16 and bf16 buffers are passed as void* holding IEEE
// binary16 or bfloat16 values. Pointers are device pointers; the kernels run on the
// backend's stream (kernels/cuda/elementwise_ops.cu: fp16; kernels/cuda/cast_bf16.cu:
// bf16). Present only in CUDA builds.
#pragma once
#include <cstdint>

namespace engine::kernels::cuda {

// out[i] = fp16(in[i]), rounded to nearest even (overflow gives +-inf).
void cast_f32_to_f16(int64_t n, const float* in, void* out);
// out[i] = float(in[i]) (exact).
void cast_f16_to_f32(int64_t n, const void* in, float* out);

// out[i] = bf16(in[i]), rounded to nearest even as kernels/bf16_math.h does (a value
// rounding past the largest finite bf16 gives +-inf; NaN stays NaN).
void cast_f32_to_bf16(int64_t n, const float* in, void* out);
// out[i] = float(in[i]) (exact).
void cast_bf16_to_f32(int64_t n, const void* in, float* out);

}  // namespace engine::kernels::cuda
