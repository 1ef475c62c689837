// ENGINE_HD marks per-element math that both backends compile: __host__ __device__
// under nvcc, nothing under a plain C++ compiler. One definition, two backends.
#pragma once
#if defined(__CUDACC__)
#define ENGINE_HD __host__ __device__ __forceinline__
#else
#define ENGINE_HD inline
#endif
