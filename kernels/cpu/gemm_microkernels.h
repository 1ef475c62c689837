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
// broadcast straight from the padded image (3 rows, 3 offsets), and dy is transposed 4
// channels x a block of pixels at a time (two shuffle levels, then each 4-channel
// piece stored where its pixel's row is) into a small buffer, the next block's while the
// current one's multiply-adds run (shuffles and multiply-adds share a port on AVX-512).
// Each element is one chain over the pixels in order, from +0 or C: the same bits.
// GCC 12 warns that the unpack and extract intrinsics' own undefined first operand
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

// kWp, kOutW, kOhw (here and on AVX2): the image geometry fixed at compile time (0:
// the run-time values), for the model's own (conv1 on 28 x 28: 30, 28, 784). Offsets
// the compiler knows become the instructions' displacements; computed at run time they
// took the integer ports the multiply-adds share (gemm_bench: AVX-512 48-50 % of peak
// at run time, 54-58 % fixed; AVX2 58 %, 60-61 %).
template <int G, int kWp = 0, int kOutW = 0, int kOhw = 0>  // N = 16 G channels: 9 G accumulators
struct Avx512TapsByChannels {
  static constexpr int N = 16 * G, kUnits = N / 4;
  // Channels 4u..4u+3 of pixels p0..p0+15 (lanes from `count` on: zeros) into
  // buf[pixel * N + 4u ..]: after two shuffle levels a vector's 128-bit lane L holds the
  // 4 channels of pixel 4L + m.
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx512f") static void unit(const float* d, int64_t ohw, int u,
                                                                           __mmask16 mask, float* buf) {
    const float* row = d + static_cast<int64_t>(4 * u) * ohw;
    const __m512 r0 = _mm512_maskz_loadu_ps(mask, row), r1 = _mm512_maskz_loadu_ps(mask, row + ohw);
    const __m512 r2 = _mm512_maskz_loadu_ps(mask, row + 2 * ohw), r3 = _mm512_maskz_loadu_ps(mask, row + 3 * ohw);
    const __m512 t0 = _mm512_unpacklo_ps(r0, r1), t1 = _mm512_unpackhi_ps(r0, r1);
    const __m512 t2 = _mm512_unpacklo_ps(r2, r3), t3 = _mm512_unpackhi_ps(r2, r3);
    const __m512 v[4] = {_mm512_shuffle_ps(t0, t2, 0x44), _mm512_shuffle_ps(t0, t2, 0xEE),
                         _mm512_shuffle_ps(t1, t3, 0x44), _mm512_shuffle_ps(t1, t3, 0xEE)};
    float* to = buf + 4 * u;
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
      _mm_storeu_ps(to + m * N, _mm512_castps512_ps128(v[m]));
      _mm_storeu_ps(to + (4 + m) * N, _mm512_extractf32x4_ps(v[m], 1));
      _mm_storeu_ps(to + (8 + m) * N, _mm512_extractf32x4_ps(v[m], 2));
      _mm_storeu_ps(to + (12 + m) * N, _mm512_extractf32x4_ps(v[m], 3));
    }
  }
  // One pixel: its 9 taps (rows b, b + wp, b + 2 wp) times its N channels.
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx512f") static void pixel(const float* b, long wp,
                                                                            const float* channels, __m512 (&acc)[9][G]) {
    __m512 v[G];
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) v[g] = _mm512_load_ps(channels + 16 * g);
    const float* rows[3] = {b, b + wp, b + 2 * wp};
#pragma GCC unroll 9
    for (int t = 0; t < 9; ++t) {
      const __m512 a = _mm512_set1_ps(rows[t / 3][t % 3]);
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) acc[t][g] = _mm512_fmadd_ps(a, v[g], acc[t][g]);
    }
  }
  ENGINE_X86_TARGET("avx512f") static void run(const TapsByChannels& in) {
    const TapsByChannels s = in;
    const long wp = kWp ? kWp : s.wp, out_w = kOutW ? kOutW : s.out_w, skip = wp - out_w;
    const int64_t ohw = kOhw ? kOhw : s.ohw;
    __m512 acc[9][G];
    for (int t = 0; t < 9; ++t)
      for (int g = 0; g < G; ++g)
        acc[t][g] = s.from_c ? _mm512_loadu_ps(s.c + t * s.ldc + 16 * g) : _mm512_setzero_ps();
    alignas(64) float buf[2][16 * N];
    for (int64_t j = 0; j * ohw < s.k; ++j) {
      const int np = static_cast<int>(std::min<int64_t>(ohw, s.k - j * ohw));
      const float* d = s.dy + j * N * ohw;
      const float* b = s.images + j * s.image_floats;
      int ow = 0;
      auto mask_of = [](int count) { return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1); };
      for (int u = 0; u < kUnits; ++u) unit(d, ohw, u, mask_of(np), buf[0]);
      for (int p0 = 0, block = 0; p0 < np; p0 += 16, ++block) {
        const float* cur = buf[block & 1];
        float* next = buf[(block + 1) & 1];
        const int count = std::min(16, np - p0);
        if (count == 16) {
          const int ahead = np - p0 - 16;  // pixels of the next block, if any
          const __mmask16 next_mask = mask_of(ahead);
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) {
            if (ahead > 0 && i % (16 / kUnits) == 0) unit(d + p0 + 16, ohw, i / (16 / kUnits), next_mask, next);
            pixel(b, wp, cur + i * N, acc);
            ++b;
            if (++ow == out_w) ow = 0, b += skip;
          }
        } else {  // the image's last, ragged block: nothing after it to transpose
          for (int i = 0; i < count; ++i) {
            pixel(b, wp, cur + i * N, acc);
            ++b;
            if (++ow == out_w) ow = 0, b += skip;
          }
        }
      }
    }
    for (int t = 0; t < 9; ++t)
      for (int g = 0; g < G; ++g) _mm512_storeu_ps(s.c + t * s.ldc + 16 * g, acc[t][g]);
  }
};

// AVX2 has 16 YMM registers: a pass takes one row of the kernel (3 taps) times all N
// channels, 3 G accumulators, so each pixel's 3 broadcasts and G channel loads feed 3 G
// multiply-adds (the 9 taps times 8 channels of one pass before: 10 loads for 9, and 9
// chains, about the 8 that keep two FMA pipes of latency 4 busy). gemm_bench, AMD EPYC
// (Zen 4): 58-59 % of peak -> 64-66 %.
template <int G, int kWp = 0, int kOutW = 0, int kOhw = 0>  // N = 8 G channels
struct Avx2TapsByChannels {
  static constexpr int N = 8 * G, kBlock = 32;
  // Channels 4u..4u+3 of pixels p0..p0+7 (from `count` on: zeros) into buf[pixel * N + 4u ..].
  __attribute__((always_inline)) ENGINE_X86_TARGET("avx2,fma") static void unit(const float* d, int64_t ohw, int u,
                                                                            int count, float* buf) {
    const float* row = d + static_cast<int64_t>(4 * u) * ohw;
    __m256 r[4];
    if (count >= 8) {
      for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_ps(row + i * ohw);
    } else {
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      for (int i = 0; i < 4; ++i) r[i] = _mm256_maskload_ps(row + i * ohw, mask);
    }
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 v[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                         _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE)};
    float* to = buf + 4 * u;
    for (int m = 0; m < 4; ++m) {
      _mm_storeu_ps(to + m * N, _mm256_castps256_ps128(v[m]));
      _mm_storeu_ps(to + (4 + m) * N, _mm256_extractf128_ps(v[m], 1));
    }
  }
  ENGINE_X86_TARGET("avx2,fma") static void run(const TapsByChannels& in) {
    const TapsByChannels s = in;
    const long wp = kWp ? kWp : s.wp, out_w = kOutW ? kOutW : s.out_w, skip = wp - out_w;
    const int64_t ohw = kOhw ? kOhw : s.ohw;
    alignas(32) float sums[9][N];  // the chains between blocks
    for (int t = 0; t < 9; ++t)
      for (int q = 0; q < N; ++q) sums[t][q] = s.from_c ? s.c[t * s.ldc + q] : 0.0f;
    alignas(32) float buf[kBlock * N];
    for (int64_t j = 0; j * ohw < s.k; ++j) {
      const int np = static_cast<int>(std::min<int64_t>(ohw, s.k - j * ohw));
      const float* d = s.dy + j * N * ohw;
      const float* image = s.images + j * s.image_floats;
      for (int p0 = 0; p0 < np; p0 += kBlock) {
        const int count = std::min(kBlock, np - p0);
        for (int p = 0; p < count; p += 8)
          for (int u = 0; u < N / 4; ++u) unit(d + p0 + p, ohw, u, count - p, buf + p * N);
        const int oh0 = static_cast<int>(p0 / out_w), ow0 = static_cast<int>(p0 % out_w);
        for (int r = 0; r < 3; ++r) {  // the kernel's row r: taps 3r..3r+2, 3 G chains
          __m256 acc[3][G];
          for (int t = 0; t < 3; ++t)
            for (int g = 0; g < G; ++g) acc[t][g] = _mm256_load_ps(&sums[3 * r + t][8 * g]);
          const float* b = image + (oh0 + r) * wp + ow0;
          int ow = ow0;
          for (int i = 0; i < count; ++i) {
            const __m256 a0 = _mm256_broadcast_ss(b), a1 = _mm256_broadcast_ss(b + 1), a2 = _mm256_broadcast_ss(b + 2);
            const float* v = buf + i * N;
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
              const __m256 x = _mm256_load_ps(v + 8 * g);
              acc[0][g] = _mm256_fmadd_ps(a0, x, acc[0][g]);
              acc[1][g] = _mm256_fmadd_ps(a1, x, acc[1][g]);
              acc[2][g] = _mm256_fmadd_ps(a2, x, acc[2][g]);
            }
            ++b;
            if (++ow == out_w) ow = 0, b += skip;
          }
          for (int t = 0; t < 3; ++t)
            for (int g = 0; g < G; ++g) _mm256_store_ps(&sums[3 * r + t][8 * g], acc[t][g]);
        }
      }
    }
    for (int t = 0; t < 9; ++t)
      for (int q = 0; q < N; ++q) s.c[t * s.ldc + q] = sums[t][q];
  }
};
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
