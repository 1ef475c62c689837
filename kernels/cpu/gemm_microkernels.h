// The GEMM's micro-kernels (kernels/cpu/gemm.cpp): one MR x NR tile of C, run over a
// k block of its operands (TileSource: packed slivers, or read in place). Each element
// is its own chain: acc = fma(a, b, acc) for kk in order, from where `start` says
// (kernels/cpu/gemm.h: +0, C, or `init`, the tile's first row or first column value).
// The paths differ only in how many chains a vector holds, so they give the same bits.
// Compiled for their instruction sets by function attributes; the driver calls the one
// the CPU supports (kernels/cpu/cpu_features.h).
#pragma once
#include <algorithm>
#include <cmath>

#include "kernels/cpu/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define ENGINE_X86_TARGET(isa) __attribute__((target(isa)))
#endif

namespace engine::kernels::cpu {
namespace {

// How a tile finds op(A)'s value for row r and k index kk (TileSource).
enum class AForm {
  Sliver,    // a[kk * a_step + r]: a packed sliver (a_step = MR), or a transposed stored
             // matrix's MR columns (a_step its row length)
  Rows,      // a[r * lda + kk]: MR rows of a stored matrix
  Gathered,  // a[a_rows[r] + a_cols[kk]]: the patches matrix's rows (taps) in the padded
             // images, a tap's offset plus a pixel's
};

// Where a tile reads its k block of op(A) and op(B). Packed, A holds the tile's op(A)
// rows k-major (AForm::Sliver, a_step = MR) and B its op(B) columns (b[kk * NR + q]).
// In place (the kernels with kInPlace), op(A) as the other AForms say, and op(B)'s row
// kk is NR contiguous floats at b + b_rows[kk] (a stored matrix's row, a tap's stretch
// of a padded image, a channel of dy). The same values either way, so the same chains:
// in place only saves the packing copy.
struct TileSource {
  const float* a = nullptr;
  long lda = 0;                      // Rows: the row stride
  long a_step = 0;                   // Sliver: from one k to the next
  const int64_t* a_rows = nullptr;  // Gathered: MR row offsets
  const int64_t* a_cols = nullptr;  // Gathered: kc column offsets
  const float* b = nullptr;
  const int64_t* b_rows = nullptr;  // B in place: row kk's offset from b; nullptr: packed
};

#if defined(__x86_64__)
// Runs Tile<rows> for rows in 1..Max (a ragged last row block).
template <template <int> class Tile, int Max>
struct TileDispatch {
  template <AForm kA, bool kRowsB>
  static void run(int rows, int kc, const TileSource& src, float* c, int ldc, ChainStart start, const float* init) {
    if constexpr (Max >= 1) {
      if (rows == Max) return Tile<Max>::template tile<kA, kRowsB>(kc, src, c, ldc, start, init);
      TileDispatch<Tile, Max - 1>::template run<kA, kRowsB>(rows, kc, src, c, ldc, start, init);
    }
  }
};

// MRows rows x 32 columns: 2 * MRows accumulators of 16 floats, 2 for op(B) and 1
// broadcast, of the 32 ZMM registers. 8 rows by default (16 accumulators: enough
// independent chains to keep two FMA units busy through their latency); a product of 9
// to 14 rows runs them as one tile of exactly that height (conv1's weight gradient has
// 9 rows: two 8-row tiles wasted 7 of 16 rows).
template <int MRows>
struct Avx512TileT {
  static_assert(MRows >= 1 && 2 * MRows + 3 <= 32, "the tile fits the ZMM registers");
  static constexpr int MR = MRows, NR = 32;
  static constexpr bool kAvx = true;      // packing may use AVX (gemm.cpp)
  static constexpr bool kInPlace = true;  // reads TileSource's in-place forms
  template <AForm kA, bool kRowsB>
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx512f") static void run(int kc, const TileSource& src, float* c,
                                                                          int ldc, ChainStart start, const float* init) {
    __m512 acc0[MR], acc1[MR];
    // C's lines are fetched now when the start is not C (its loads did that), so the
    // stores at the end do not wait for them: with K = 9 that wait was a fifth slower.
    if (start != ChainStart::C) {
      float* cr = c;
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r, cr += ldc) {
        _mm_prefetch(reinterpret_cast<const char*>(cr), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(cr + NR - 1), _MM_HINT_T0);
      }
    }
    // One loop per start, the choice outside it.
    switch (start) {
      case ChainStart::C: {
        const float* cr = c;
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r, cr += ldc) acc0[r] = _mm512_loadu_ps(cr), acc1[r] = _mm512_loadu_ps(cr + 16);
        break;
      }
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
    // Locals, and pointers stepped rather than indices multiplied: the loop then holds
    // no integer multiply and no reload of src (AVX2's tile: 82 -> 87 % of peak in L1).
    const long lda = src.lda, a_step = kA == AForm::Rows ? 1 : src.a_step;
    const float* ak = src.a;
    const int64_t* a_cols = src.a_cols;
    int64_t a_rows[MR];  // Gathered: kept in registers through the loop
    if constexpr (kA == AForm::Gathered)
      for (int r = 0; r < MR; ++r) a_rows[r] = src.a_rows[r];
    const float* bp = src.b;
    const int64_t* b_rows = src.b_rows;
#pragma GCC unroll 4
    for (int kk = 0; kk < kc; ++kk, ak += kA == AForm::Gathered ? 0 : a_step, bp += kRowsB ? 0 : NR) {
      const float* bk = kRowsB ? bp + b_rows[kk] : bp;
      const __m512 b0 = kRowsB ? _mm512_loadu_ps(bk) : _mm512_load_ps(bk);
      const __m512 b1 = kRowsB ? _mm512_loadu_ps(bk + 16) : _mm512_load_ps(bk + 16);
      const float* ag = kA == AForm::Gathered ? ak + a_cols[kk] : nullptr;  // ak stays at src.a
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 ar = _mm512_set1_ps(kA == AForm::Rows       ? ak[r * lda]
                                         : kA == AForm::Gathered ? ag[a_rows[r]]
                                                                 : ak[r]);
        acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
      }
    }
    float* cr = c;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r, cr += ldc) _mm512_storeu_ps(cr, acc0[r]), _mm512_storeu_ps(cr + 16, acc1[r]);
  }
  template <AForm kA, bool kRowsB>
  ENGINE_X86_TARGET("avx512f")
  static void tile(int kc, const TileSource& src, float* c, int ldc, ChainStart start, const float* init) {
    run<kA, kRowsB>(kc, src, c, ldc, start, init);
  }
  // `count` whole tiles down a column sliver in one call, op(A) a_next floats further
  // and C MR rows lower for each (Sliver and Rows forms; init: as for the first tile).
  template <AForm kA, bool kRowsB>
  ENGINE_X86_TARGET("avx512f")
  static void tiles(int count, int kc, TileSource src, long a_next, float* c, int ldc, ChainStart start,
                    const float* init) {
    static_assert(kA != AForm::Gathered, "a gathered op(A) has its own row offsets per tile");
    for (int t = 0; t < count; ++t, src.a += a_next, c += static_cast<long>(MR) * ldc)
      run<kA, kRowsB>(kc, src, c, ldc, start, start == ChainStart::RowValues ? init + t * MR : init);
  }
  // The first `rows` (< MR) rows of a tile: a product's last rows, by a kernel of that
  // height, on C itself (a packed sliver keeps its MR stride: a_step).
  template <AForm kA, bool kRowsB>
  static void top_rows(int rows, int kc, const TileSource& src, float* c, int ldc, ChainStart start,
                       const float* init) {
    TileDispatch<Avx512TileT, MR - 1>::template run<kA, kRowsB>(rows, kc, src, c, ldc, start, init);
  }
};
using Avx512Tile = Avx512TileT<8>;


// 6 rows x 16 columns: 12 accumulators of 8 floats, 2 for op(B) and 1 broadcast, of
// the 16 YMM registers (BLIS's Haswell shape); fewer rows for a product's last rows.
template <int MRows>
struct Avx2TileT {
  static_assert(MRows >= 1 && 2 * MRows + 3 <= 16, "the tile fits the YMM registers");
  static constexpr int MR = MRows, NR = 16;
  static constexpr bool kAvx = true;
  static constexpr bool kInPlace = true;
  template <AForm kA, bool kRowsB>
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx2,fma") static void run(int kc, const TileSource& src, float* c,
                                                                          int ldc, ChainStart start, const float* init) {
    __m256 acc0[MR], acc1[MR];
    if (start != ChainStart::C) {  // as Avx512TileT
      float* cr = c;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r, cr += ldc) {
        _mm_prefetch(reinterpret_cast<const char*>(cr), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(cr + NR - 1), _MM_HINT_T0);
      }
    }
    switch (start) {
      case ChainStart::C: {
        const float* cr = c;
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r, cr += ldc) acc0[r] = _mm256_loadu_ps(cr), acc1[r] = _mm256_loadu_ps(cr + 8);
        break;
      }
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
    // Locals, and pointers stepped rather than indices multiplied: the loop then holds
    // no integer multiply and no reload of src (AVX2's tile: 82 -> 87 % of peak in L1).
    const long lda = src.lda, a_step = kA == AForm::Rows ? 1 : src.a_step;
    const float* ak = src.a;
    const int64_t* a_cols = src.a_cols;
    int64_t a_rows[MR];  // Gathered: kept in registers through the loop
    if constexpr (kA == AForm::Gathered)
      for (int r = 0; r < MR; ++r) a_rows[r] = src.a_rows[r];
    const float* bp = src.b;
    const int64_t* b_rows = src.b_rows;
#pragma GCC unroll 4
    for (int kk = 0; kk < kc; ++kk, ak += kA == AForm::Gathered ? 0 : a_step, bp += kRowsB ? 0 : NR) {
      const float* bk = kRowsB ? bp + b_rows[kk] : bp;
      const __m256 b0 = kRowsB ? _mm256_loadu_ps(bk) : _mm256_load_ps(bk);
      const __m256 b1 = kRowsB ? _mm256_loadu_ps(bk + 8) : _mm256_load_ps(bk + 8);
      const float* ag = kA == AForm::Gathered ? ak + a_cols[kk] : nullptr;  // ak stays at src.a
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 ar = _mm256_broadcast_ss(kA == AForm::Rows       ? ak + r * lda
                                              : kA == AForm::Gathered ? ag + a_rows[r]
                                                                      : ak + r);
        acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
      }
    }
    float* cr = c;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r, cr += ldc) _mm256_storeu_ps(cr, acc0[r]), _mm256_storeu_ps(cr + 8, acc1[r]);
  }
  template <AForm kA, bool kRowsB>
  ENGINE_X86_TARGET("avx2,fma")
  static void tile(int kc, const TileSource& src, float* c, int ldc, ChainStart start, const float* init) {
    run<kA, kRowsB>(kc, src, c, ldc, start, init);
  }
  // `count` whole tiles down a column sliver in one call, op(A) a_next floats further
  // and C MR rows lower for each (Sliver and Rows forms; init: as for the first tile).
  template <AForm kA, bool kRowsB>
  ENGINE_X86_TARGET("avx2,fma")
  static void tiles(int count, int kc, TileSource src, long a_next, float* c, int ldc, ChainStart start,
                    const float* init) {
    static_assert(kA != AForm::Gathered, "a gathered op(A) has its own row offsets per tile");
    for (int t = 0; t < count; ++t, src.a += a_next, c += static_cast<long>(MR) * ldc)
      run<kA, kRowsB>(kc, src, c, ldc, start, start == ChainStart::RowValues ? init + t * MR : init);
  }
  template <AForm kA, bool kRowsB>  // as Avx512TileT's
  static void top_rows(int rows, int kc, const TileSource& src, float* c, int ldc, ChainStart start,
                       const float* init) {
    TileDispatch<Avx2TileT, MR - 1>::template run<kA, kRowsB>(rows, kc, src, c, ldc, start, init);
  }
};
using Avx2Tile = Avx2TileT<6>;

// A short K (conv1's forward: 9 taps), the other way round: op(B)'s K rows of a strip
// of W columns held in registers, and C's rows taken G at a time, each element's chain
// fed op(A)'s values broadcast from memory. The tiles above hold C in registers and
// stream op(B): at K = 9 their set-up, loads and stores per 9 multiply-adds kept the
// AVX-512 product at 64 % of peak, and this form runs it above 80 %. Each element is
// still one chain from its start over kk = 0..K-1 in order: the same bits.
struct ShortKStrips {
  const float* a = nullptr;  // op(A) as rows kMaxK apart: a[r * kMaxK + kk]
  const float* b = nullptr;  // the first strip's row kk: b + b_off[kk]; the next strip W floats on
  const int64_t* b_off = nullptr;
  float* c = nullptr;
  long ldc = 0;
  int m = 0, k = 0;
  int strips = 1, cols = 0;  // cols: columns of each strip (fewer than W: the last, alone)
  ChainStart start = ChainStart::Zero;
  const float* values = nullptr;  // RowValues: row 0's; ColumnValues: the first strip's column 0's
};

// Row r's start values, for RowValues.
inline const float* row_values(const ShortKStrips& s, int r) {
  return s.start == ChainStart::RowValues ? s.values + r : nullptr;
}

template <int KMax>
struct Avx512ShortK {
  static constexpr int W = 16, G = 8, kMaxK = KMax;  // KMax op(B) and G accumulators: 28 of 32 ZMM
  template <int Rows, bool Whole>  // Whole: all W columns, so plain loads and stores
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx512f") static void rows(const __m512* bv, int k, ChainStart start,
                                                                           const float* a, float* c, long ldc,
                                                                           const float* row_values, __m512 column_start,
                                                                           __mmask16 mask) {
    __m512 acc[Rows];
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r)
      acc[r] = start == ChainStart::RowValues ? _mm512_set1_ps(row_values[r])
               : start == ChainStart::C ? (Whole ? _mm512_loadu_ps(c + r * ldc) : _mm512_maskz_loadu_ps(mask, c + r * ldc))
                                                : column_start;
#pragma GCC unroll 16
    for (int kk = 0; kk < KMax; ++kk) {
      if (kk == k) break;
#pragma GCC unroll 16
      for (int r = 0; r < Rows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * KMax + kk]), bv[kk], acc[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r, c += ldc)
      if constexpr (Whole)
        _mm512_storeu_ps(c, acc[r]);
      else
        _mm512_mask_storeu_ps(c, mask, acc[r]);
  }
  // The fields in locals: the compiler cannot tell that C's stores leave `in` alone, and
  // reloaded ldc after every store.
  ENGINE_X86_TARGET("avx512f") static void strips(const ShortKStrips& in) {
    const ShortKStrips s = in;
    const int k = s.k, m = s.m;
    const long ldc = s.ldc;
    const ChainStart start = s.start;
    const __mmask16 mask = s.cols >= W ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << s.cols) - 1);
    const float* b = s.b;
    float* c = s.c;
    for (int t = 0; t < s.strips; ++t, b += W, c += W) {
      __m512 bv[KMax];
#pragma GCC unroll 16
      for (int kk = 0; kk < KMax; ++kk) bv[kk] = kk < k ? _mm512_loadu_ps(b + s.b_off[kk]) : _mm512_setzero_ps();
      const __m512 column_start =
          start == ChainStart::ColumnValues ? _mm512_maskz_loadu_ps(mask, s.values + t * W) : _mm512_setzero_ps();
      int r = 0;
      for (; r + G <= m; r += G)
        s.cols == W ? rows<G, true>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask)
                    : rows<G, false>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask);
      for (; r < m; ++r)
        s.cols == W ? rows<1, true>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask)
                    : rows<1, false>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask);
    }
  }
};

template <int KMax>
struct Avx2ShortK {
  static constexpr int W = 8, G = 4, kMaxK = KMax;  // KMax op(B), G accumulators and a broadcast of 16 YMM
  template <int Rows, bool Whole>
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx2,fma") static void rows(const __m256* bv, int k, ChainStart start,
                                                                            const float* a, float* c, long ldc,
                                                                            const float* row_values, __m256 column_start,
                                                                            __m256i mask) {
    __m256 acc[Rows];
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r)
      acc[r] = start == ChainStart::RowValues ? _mm256_set1_ps(row_values[r])
               : start == ChainStart::C ? (Whole ? _mm256_loadu_ps(c + r * ldc) : _mm256_maskload_ps(c + r * ldc, mask))
                                                : column_start;
#pragma GCC unroll 16
    for (int kk = 0; kk < KMax; ++kk) {
      if (kk == k) break;
#pragma GCC unroll 8
      for (int r = 0; r < Rows; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + r * KMax + kk), bv[kk], acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r, c += ldc)
      if constexpr (Whole)
        _mm256_storeu_ps(c, acc[r]);
      else
        _mm256_maskstore_ps(c, mask, acc[r]);
  }
  ENGINE_X86_TARGET("avx2,fma") static void strips(const ShortKStrips& in) {  // as Avx512ShortK's
    const ShortKStrips s = in;
    const int k = s.k, m = s.m;
    const long ldc = s.ldc;
    const ChainStart start = s.start;
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(s.cols), lanes);  // lane < cols: all ones
    const float* b = s.b;
    float* c = s.c;
    for (int t = 0; t < s.strips; ++t, b += W, c += W) {
      __m256 bv[KMax];
#pragma GCC unroll 16
      for (int kk = 0; kk < KMax; ++kk) bv[kk] = kk < k ? _mm256_loadu_ps(b + s.b_off[kk]) : _mm256_setzero_ps();
      const __m256 column_start =
          start == ChainStart::ColumnValues ? _mm256_maskload_ps(s.values + t * W, mask) : _mm256_setzero_ps();
      int r = 0;
      for (; r + G <= m; r += G)
        s.cols == W ? rows<G, true>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask)
                    : rows<G, false>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask);
      for (; r < m; ++r)
        s.cols == W ? rows<1, true>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask)
                    : rows<1, false>(bv, k, start, s.a + r * KMax, c + r * ldc, ldc, row_values(s, r), column_start, mask);
    }
  }
};

// The short-K kernel each tile kernel's path has (void: none, the tiles run every K),
// and the longest K it takes.
template <class Tile>
struct ShortKOf {
  using type = void;
};
template <int MRows>
struct ShortKOf<Avx512TileT<MRows>> {
  using type = Avx512ShortK<12>;
};
template <int MRows>
struct ShortKOf<Avx2TileT<MRows>> {
  using type = Avx2ShortK<9>;
};

// conv1's weight gradient, dW^T[9, N] = P[9, K] * dy^T[K, N] (kernels/cpu/conv.cpp): the
// patches of one-channel images and a 3 x 3 kernel, dy's N channels stored as rows of
// each image's pixels. The tiles would pack both operands across (the 9 taps of a pixel
// lie in 3 rows of the padded image, its N channels one image row apart), which held the
// product at 36 % of peak. Here the lanes run over channels: each pixel's taps are
// broadcast straight from the padded image (3 rows, 3 offsets), and dy is transposed in
// registers, 4 pixels at a time: each vector is put together from 128-bit pieces of 4
// (AVX2: 2) channel rows, loaded into its lanes without a shuffle; then one 4 x 4
// transposition inside the lanes (two shuffle levels) leaves each pixel's channels in
// order in a vector. Transposing through a buffer instead (the shuffles, then each
// 4-channel piece extracted and stored where its pixel's row is) held the product at
// 65 % of peak on Zen 4 on both paths; in registers it runs at 87-88 % (AVX-512) and 77 %
// (AVX2) (docs/benchmarks.md). Each element is one chain over the pixels in order, from
// +0 or C: the same bits.
// GCC 12 warns that the unpack intrinsics' own undefined first operand
// "may be used uninitialized" once inlined here (a false positive in its headers).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
struct TapsByChannels {
  const float* images = nullptr;  // the padded images, image_floats apart
  int64_t image_floats = 0;
  int wp = 0, out_w = 0, ohw = 0;  // the padded width; output pixels per row and per image
  const float* dy = nullptr;       // per image, n rows of ohw pixels
  int n = 0;
  int64_t k = 0;                   // pixels in all, image after image
  float* c = nullptr;              // C[tap][channel], rows ldc apart
  long ldc = 0;
  bool from_c = false;  // the chains start from C (else +0)
};

// An image's last pixels, fewer than 4: lane L (of kLanes) gets pixels 0..count-1 of the
// row r + L * row_floats, then zeros (nothing is read past the image's pixels).
template <int kLanes>
inline void gather_pixel_quads(const float* r, int64_t row_floats, int count, float* to) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) to[4 * lane + i] = i < count ? r[lane * row_floats + i] : 0.0f;
}

// 4 x 4 transposition inside each 128-bit lane: lane L of w[k] holds channel 4L + k (of
// the vectors' channels) at pixels 0..3; then lane L of v[m] holds channels 4L..4L+3 at
// pixel m, so v[m] is pixel m's channels in order.
#define ENGINE_TRANSPOSE_QUADS(PS, w, v)                                                        \
  do {                                                                                          \
    const auto t0 = _##PS##_unpacklo_ps(w[0], w[1]), t1 = _##PS##_unpackhi_ps(w[0], w[1]);     \
    const auto t2 = _##PS##_unpacklo_ps(w[2], w[3]), t3 = _##PS##_unpackhi_ps(w[2], w[3]);     \
    v[0] = _##PS##_shuffle_ps(t0, t2, 0x44), v[1] = _##PS##_shuffle_ps(t0, t2, 0xEE);          \
    v[2] = _##PS##_shuffle_ps(t1, t3, 0x44), v[3] = _##PS##_shuffle_ps(t1, t3, 0xEE);          \
  } while (0)

// kWp, kOutW, kOhw (here and on AVX2): the image geometry fixed at compile time (0:
// the run-time values), for the model's own (conv1 on 28 x 28: 30, 28, 784). Offsets
// the compiler knows become the instructions' displacements; computed at run time they
// took the integer ports the multiply-adds share.
//
// AVX-512: all 9 taps times all N channels in registers (9 G accumulators); for each 4
// pixels and 16 channels, 4 vectors of 4 inserted 128-bit pieces, 8 shuffles, and 36
// multiply-adds whose broadcasts are memory operands.
template <int G, int kWp = 0, int kOutW = 0, int kOhw = 0>  // N = 16 G channels
struct Avx512TapsByChannels {
  static constexpr int N = 16 * G;
  // Lane L: channel c + 4 L, pixels p..p+3 (d points at channel c, pixel p).
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx512f") static __m512 quads(const float* d, int64_t ohw,
                                                                              int count) {
    if (count == 4) {
      __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(d));
      v = _mm512_insertf32x4(v, _mm_loadu_ps(d + 4 * ohw), 1);
      v = _mm512_insertf32x4(v, _mm_loadu_ps(d + 8 * ohw), 2);
      return _mm512_insertf32x4(v, _mm_loadu_ps(d + 12 * ohw), 3);
    }
    alignas(64) float piece[16];
    gather_pixel_quads<4>(d, 4 * ohw, count, piece);
    return _mm512_load_ps(piece);
  }
  ENGINE_X86_TARGET("avx512f") static void run(const TapsByChannels& in) {
    const TapsByChannels s = in;
    const long wp = kWp ? kWp : s.wp, out_w = kOutW ? kOutW : s.out_w, skip = wp - out_w;
    const int64_t ohw = kOhw ? kOhw : s.ohw;
    __m512 acc[9][G];
    for (int t = 0; t < 9; ++t)
      for (int g = 0; g < G; ++g)
        acc[t][g] = s.from_c ? _mm512_loadu_ps(s.c + t * s.ldc + 16 * g) : _mm512_setzero_ps();
    for (int64_t j = 0; j * ohw < s.k; ++j) {
      const int np = static_cast<int>(std::min<int64_t>(ohw, s.k - j * ohw));
      const float* d = s.dy + j * N * ohw;
      const float* b = s.images + j * s.image_floats;
      int ow = 0;
      for (int p0 = 0; p0 < np; p0 += 4) {
        const int count = std::min(4, np - p0);
        const float* at[4];  // each pixel's first tap
        for (int m = 0; m < 4; ++m) {
          at[m] = b;
          if (m < count) {
            ++b;
            if (++ow == out_w) ow = 0, b += skip;
          }
        }
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g) {
          __m512 w[4], v[4];
          for (int k = 0; k < 4; ++k) w[k] = quads(d + (16 * g + k) * ohw + p0, ohw, count);
          ENGINE_TRANSPOSE_QUADS(mm512, w, v);
#pragma GCC unroll 4
          for (int m = 0; m < 4; ++m) {
            if (m == count) break;
#pragma GCC unroll 9
            for (int t = 0; t < 9; ++t)
              acc[t][g] = _mm512_fmadd_ps(_mm512_set1_ps(at[m][(t / 3) * wp + t % 3]), v[m], acc[t][g]);
          }
        }
      }
    }
    for (int t = 0; t < 9; ++t)
      for (int g = 0; g < G; ++g) _mm512_storeu_ps(s.c + t * s.ldc + 16 * g, acc[t][g]);
  }
};

// AVX2 has 16 YMM registers: a pass takes 8 channels over an image's pixels (9
// accumulators, 4 transposed pixels, a broadcast); for each 4 pixels, 4 vectors of a
// load and an inserted 128-bit piece, 8 shuffles and 36 multiply-adds. Between passes
// the chains wait in `sums`.
template <int G, int kWp = 0, int kOutW = 0, int kOhw = 0>  // N = 8 G channels
struct Avx2TapsByChannels {
  static constexpr int N = 8 * G;
  // Lane L: channel c + 4 L, pixels p..p+3 (d points at channel c, pixel p).
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx2,fma") static __m256 quads(const float* d, int64_t ohw,
                                                                               int count) {
    if (count == 4) return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(d)), _mm_loadu_ps(d + 4 * ohw), 1);
    alignas(32) float piece[8];
    gather_pixel_quads<2>(d, 4 * ohw, count, piece);
    return _mm256_load_ps(piece);
  }
  ENGINE_X86_TARGET("avx2,fma") static void run(const TapsByChannels& in) {
    const TapsByChannels s = in;
    const long wp = kWp ? kWp : s.wp, out_w = kOutW ? kOutW : s.out_w, skip = wp - out_w;
    const int64_t ohw = kOhw ? kOhw : s.ohw;
    alignas(32) float sums[9][N];  // the chains between passes
    for (int t = 0; t < 9; ++t)
      for (int q = 0; q < N; ++q) sums[t][q] = s.from_c ? s.c[t * s.ldc + q] : 0.0f;
    for (int64_t j = 0; j * ohw < s.k; ++j) {
      const int np = static_cast<int>(std::min<int64_t>(ohw, s.k - j * ohw));
      for (int g = 0; g < G; ++g) {
        const float* d = s.dy + (j * N + 8 * g) * ohw;
        __m256 acc[9];
        for (int t = 0; t < 9; ++t) acc[t] = _mm256_load_ps(&sums[t][8 * g]);
        const float* b = s.images + j * s.image_floats;
        int ow = 0;
        for (int p0 = 0; p0 < np; p0 += 4) {
          const int count = std::min(4, np - p0);
          __m256 w[4], v[4];
          for (int k = 0; k < 4; ++k) w[k] = quads(d + k * ohw + p0, ohw, count);
          ENGINE_TRANSPOSE_QUADS(mm256, w, v);
#pragma GCC unroll 4
          for (int m = 0; m < 4; ++m) {
            if (m == count) break;
#pragma GCC unroll 9
            for (int t = 0; t < 9; ++t)
              acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(b + (t / 3) * wp + t % 3), v[m], acc[t]);
            ++b;
            if (++ow == out_w) ow = 0, b += skip;
          }
        }
        for (int t = 0; t < 9; ++t) _mm256_store_ps(&sums[t][8 * g], acc[t]);
      }
    }
    for (int t = 0; t < 9; ++t)
      for (int q = 0; q < N; ++q) s.c[t * s.ldc + q] = sums[t][q];
  }
};
#undef ENGINE_TRANSPOSE_QUADS
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
template <class Tile>
struct ShortKOf {
  using type = void;
};
#endif

// Any CPU: std::fma, one correctly rounded multiply-add. The body is written once;
// on x86-64 it is compiled twice, for CPUs with FMA (the instruction, vectorised) and
// without (glibc's exact software fmaf, a call per multiply-add: the same bits, slowly).
template <int MR, int NR>
__attribute__((always_inline)) inline void portable_tile(int kc, const float* ap, const float* bp, float* c, int ldc,
                                                         ChainStart start, const float* init) {  // packed A and B
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
  static constexpr bool kInPlace = false;  // packed operands only
  template <AForm kA, bool kRowsB>
  static void tile(int kc, const TileSource& src, float* c, int ldc, ChainStart start, const float* init) {
    portable_tile<MR, NR>(kc, src.a, src.b, c, ldc, start, init);  // packed: a_step = MR
  }
};

#if defined(__x86_64__)
struct PortableFmaTile {
  static constexpr int MR = 4, NR = 16;
  static constexpr bool kAvx = false;
  static constexpr bool kInPlace = false;
  template <AForm kA, bool kRowsB>
  ENGINE_X86_TARGET("fma")
  static void tile(int kc, const TileSource& src, float* c, int ldc, ChainStart start, const float* init) {
    portable_tile<MR, NR>(kc, src.a, src.b, c, ldc, start, init);  // packed: a_step = MR
  }
};
#endif

}  // namespace
}  // namespace engine::kernels::cpu
