// The GEMM's micro-kernels (kernels/cpu/gemm.cpp): one MR x NR tile of C, run over a
// packed k block. ap holds the tile's op(A) rows k-major (ap[kk * MR + r]), bp its op(B)
// columns (bp[kk * NR + q]). Each element is its own chain: acc = fma(a, b, acc) for kk
// in order, from where `start` says (kernels/cpu/gemm.h: +0, C, or `init`, the tile's
// first row or first column value). The paths differ only in how many chains a vector
// holds, so they give the same bits. Compiled for their instruction sets by function
// attributes; the driver calls the one the CPU supports (kernels/cpu/cpu_features.h).
#pragma once
#include <cmath>

#include "kernels/cpu/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ENGINE_X86_TARGET(isa) __attribute__((target(isa)))
#endif

namespace engine::kernels::cpu {
namespace {

#if defined(__x86_64__)
// MRows rows x 32 columns: 2 * MRows accumulators of 16 floats, 2 for op(B) and 1
// broadcast, of the 32 ZMM registers. 8 rows by default (16 accumulators: enough
// independent chains to keep two FMA units busy through their latency); a product of 9
// to 14 rows runs them as one tile of exactly that height (conv1's weight gradient has
// 9 rows: two 8-row tiles wasted 7 of 16 rows).
template <int MRows>
struct Avx512TileT {
  static_assert(MRows >= 1 && 2 * MRows + 3 <= 32, "the tile fits the ZMM registers");
  static constexpr int MR = MRows, NR = 32;
  static constexpr bool kAvx = true;  // packing may use AVX (gemm.cpp)
  static constexpr bool kDirectA = true;  // tile_rows reads op(A) unpacked
  // op(A) from a packed sliver (ap[kk * MR + r]) or, kRows, straight from MR rows of
  // a stored matrix (ap[r * lda + kk]): the same values, so the same chains.
  template <bool kRows>
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx512f") static void run(int kc, const float* ap, long lda,
                                                                          const float* bp, float* c, int ldc,
                                                                          ChainStart start, const float* init) {
    __m512 acc0[MR], acc1[MR];
    const float* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = ap + r * lda;
    // C's lines are fetched now when the start is not C (its loads did that), so the
    // stores at the end do not wait for them: with K = 9 that wait was a fifth slower.
    if (start != ChainStart::C)
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(c + static_cast<long>(r) * ldc), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c + static_cast<long>(r) * ldc + NR - 1), _MM_HINT_T0);
      }
    // One loop per start, the choice outside it.
    switch (start) {
      case ChainStart::C:
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r)
          acc0[r] = _mm512_loadu_ps(c + static_cast<long>(r) * ldc), acc1[r] = _mm512_loadu_ps(c + static_cast<long>(r) * ldc + 16);
        break;
      case ChainStart::RowValues:
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_set1_ps(init[r]);
        break;
      case ChainStart::ColumnValues: {
        const __m512 v0 = _mm512_loadu_ps(init), v1 = _mm512_loadu_ps(init + 16);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) acc0[r] = v0, acc1[r] = v1;
        break;
      }
      default:
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    }
    for (int kk = 0; kk < kc; ++kk) {
      const __m512 b0 = _mm512_load_ps(bp + kk * NR), b1 = _mm512_load_ps(bp + kk * NR + 16);
      const float* a = ap + kk * MR;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 ar = _mm512_set1_ps(kRows ? rows[r][kk] : a[r]);
        acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      _mm512_storeu_ps(c + static_cast<long>(r) * ldc, acc0[r]);
      _mm512_storeu_ps(c + static_cast<long>(r) * ldc + 16, acc1[r]);
    }
  }
  ENGINE_X86_TARGET("avx512f")
  static void tile(int kc, const float* ap, const float* bp, float* c, int ldc, ChainStart start, const float* init) {
    run<false>(kc, ap, 0, bp, c, ldc, start, init);
  }
  ENGINE_X86_TARGET("avx512f")
  static void tile_rows(int kc, const float* a, long lda, const float* bp, float* c, int ldc, ChainStart start,
                        const float* init) {
    run<true>(kc, a, lda, bp, c, ldc, start, init);
  }
};
using Avx512Tile = Avx512TileT<8>;


// 6 rows x 16 columns: 12 accumulators of 8 floats, 2 for op(B) and 1 broadcast, of
// the 16 YMM registers (BLIS's Haswell shape).
struct Avx2Tile {
  static constexpr int MR = 6, NR = 16;
  static constexpr bool kAvx = true;
  static constexpr bool kDirectA = true;  // tile_rows reads op(A) unpacked
  // op(A) from a packed sliver (ap[kk * MR + r]) or, kRows, straight from MR rows of
  // a stored matrix (ap[r * lda + kk]): the same values, so the same chains.
  template <bool kRows>
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx2,fma") static void run(int kc, const float* ap, long lda,
                                                                          const float* bp, float* c, int ldc,
                                                                          ChainStart start, const float* init) {
    __m256 acc0[MR], acc1[MR];
    const float* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = ap + r * lda;
    // C's lines are fetched now when the start is not C (its loads did that), so the
    // stores at the end do not wait for them: with K = 9 that wait was a fifth slower.
    if (start != ChainStart::C)
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(c + static_cast<long>(r) * ldc), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c + static_cast<long>(r) * ldc + NR - 1), _MM_HINT_T0);
      }
    // One loop per start, the choice outside it.
    switch (start) {
      case ChainStart::C:
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
          acc0[r] = _mm256_loadu_ps(c + static_cast<long>(r) * ldc), acc1[r] = _mm256_loadu_ps(c + static_cast<long>(r) * ldc + 8);
        break;
      case ChainStart::RowValues:
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_set1_ps(init[r]);
        break;
      case ChainStart::ColumnValues: {
        const __m256 v0 = _mm256_loadu_ps(init), v1 = _mm256_loadu_ps(init + 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) acc0[r] = v0, acc1[r] = v1;
        break;
      }
      default:
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    }
    for (int kk = 0; kk < kc; ++kk) {
      const __m256 b0 = _mm256_load_ps(bp + kk * NR), b1 = _mm256_load_ps(bp + kk * NR + 8);
      const float* a = ap + kk * MR;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 ar = _mm256_broadcast_ss(kRows ? rows[r] + kk : a + r);
        acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      _mm256_storeu_ps(c + static_cast<long>(r) * ldc, acc0[r]);
      _mm256_storeu_ps(c + static_cast<long>(r) * ldc + 8, acc1[r]);
    }
  }
  ENGINE_X86_TARGET("avx2,fma")
  static void tile(int kc, const float* ap, const float* bp, float* c, int ldc, ChainStart start, const float* init) {
    run<false>(kc, ap, 0, bp, c, ldc, start, init);
  }
  ENGINE_X86_TARGET("avx2,fma")
  static void tile_rows(int kc, const float* a, long lda, const float* bp, float* c, int ldc, ChainStart start,
                        const float* init) {
    run<true>(kc, a, lda, bp, c, ldc, start, init);
  }
};
#endif

// Any CPU: std::fma, one correctly rounded multiply-add. The body is written once;
// on x86-64 it is compiled twice, for CPUs with FMA (the instruction, vectorised) and
// without (glibc's exact software fmaf, a call per multiply-add: the same bits, slowly).
template <int MR, int NR>
__attribute__((always_inline)) inline void portable_tile(int kc, const float* ap, const float* bp, float* c, int ldc,
                                                         ChainStart start, const float* init) {
  float acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q)
      acc[r][q] = start == ChainStart::C              ? c[static_cast<long>(r) * ldc + q]
                  : start == ChainStart::RowValues    ? init[r]
                  : start == ChainStart::ColumnValues ? init[q]
                                                      : 0.0f;
  for (int kk = 0; kk < kc; ++kk) {
    const float* a = ap + kk * MR;
    const float* b = bp + kk * NR;
    for (int r = 0; r < MR; ++r)
      for (int q = 0; q < NR; ++q) acc[r][q] = std::fma(a[r], b[q], acc[r][q]);
  }
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < NR; ++q) c[static_cast<long>(r) * ldc + q] = acc[r][q];
}

struct PortableTile {
  static constexpr int MR = 4, NR = 16;
  static constexpr bool kAvx = false;
  static constexpr bool kDirectA = false;
  static void tile(int kc, const float* ap, const float* bp, float* c, int ldc, ChainStart start,
                   const float* init) {
    portable_tile<MR, NR>(kc, ap, bp, c, ldc, start, init);
  }
};

#if defined(__x86_64__)
struct PortableFmaTile {
  static constexpr int MR = 4, NR = 16;
  static constexpr bool kAvx = false;
  static constexpr bool kDirectA = false;
  ENGINE_X86_TARGET("fma")
  static void tile(int kc, const float* ap, const float* bp, float* c, int ldc, ChainStart start,
                   const float* init) {
    portable_tile<MR, NR>(kc, ap, bp, c, ldc, start, init);
  }
};
#endif

}  // namespace
}  // namespace engine::kernels::cpu
