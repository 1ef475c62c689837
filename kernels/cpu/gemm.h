// The engine's own single-precision GEMM (no BLAS: no BLAS gives the same bits on every
// CPU). Row-major, as cblas_sgemm(CblasRowMajor, ...):
//   C[M,N] = beta * C + op(A)[M,K] * op(B)[K,N],   beta 0 or 1, alpha 1.
// Every element of C is one chain of fused multiply-adds over k = 0..K-1, in that
// order, starting from its initial value (+0 when beta is 0, C when beta is 1); the
// K blocks carry the chain through C, never restart it. So the path (AVX-512, AVX2, the
// portable std::fma) and the blocking cannot change a bit: they differ only in how many
// chains run side by side. Single-threaded: the callers run it inside their own fixed
// chunks of work (conv.cpp, linear.cpp), so the thread count changes nothing either.
#pragma once
#include "kernels/cpu/cpu_features.h"

namespace engine::kernels::cpu {

enum class Trans { No, Yes };

void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc);

// One path's GEMM, for the tests and kernel_bench (which compare the paths); calling a
// path the CPU lacks is the caller's error (cpu_supports).
void gemm_with(CpuKernels path, Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);
// The portable path as a CPU without FMA runs it (std::fma in software, glibc's exact
// fmaf), whatever this CPU has: the tests check that it gives the same bits too.
void gemm_portable_software_fma(Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda,
                                const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace engine::kernels::cpu
