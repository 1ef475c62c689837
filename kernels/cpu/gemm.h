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
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/ops.h"

namespace engine::kernels::cpu {

enum class Trans { No, Yes };

// Where each element's chain of multiply-adds starts. A bias as the start is the same
// chain as C filled with the bias and beta 1, without the pass that fills C or the
// loads of it.
enum class ChainStart {
  Zero,          // +0 (beta 0)
  C,             // C's value (beta 1)
  RowValues,     // values[i] for every element of row i (a convolution's bias)
  ColumnValues,  // values[j] for every element of column j (a linear layer's bias)
};

// Images with their zero padding, [images][C][H + 2 pad][W + 2 pad], then S - 1 floats
// of slack: the convolution's patches are read from them without a bounds check
// (pad_images fills them; padded_images_floats says how many floats they take).
struct PaddedImages {
  const float* data = nullptr;
  int c = 0, hp = 0, wp = 0;  // channels, padded height and width
  int r = 0, s = 0;           // kernel height and width
  int out_h = 0, out_w = 0;
  int64_t image_floats() const { return static_cast<int64_t>(c) * hp * wp; }
};
std::size_t padded_images_floats(const ConvShape& s, int images);
PaddedImages pad_images(const ConvShape& s, const float* x, int images, float* dst);

// The columns of a convolution's patches matrix (its rows are the taps (c*R + r)*S + q).
enum class PatchColumns {
  // The output pixels j*OH*OW + oh*OW + ow: the im2col matrix,
  //   P[tap][j, oh, ow] = x_j[c, oh + r - pad, ow + q - pad], 0 outside.
  Pixels,
  // The output rows at the padded width, j*OH*Wp + oh*Wp + ow for ow < Wp: the same
  // values for ow < OW, and for OW <= ow < Wp whatever the padded rows hold there
  // (columns that are not outputs, for the caller to drop). A tap's row is then one
  // contiguous stretch of each padded image, packed by plain copies.
  PaddedRows,
};

// An operand of the GEMM: a stored row-major matrix, or one read straight from a
// convolution's tensors while its panels are packed (implicit GEMM: no im2col buffer).
// Whatever the source, the values and the chain order are those of the matrix it
// stands for, so the bits are too.
struct Operand {
  enum class Source { Dense, Patches, ImageRows };
  Source source = Source::Dense;
  Trans trans = Trans::No;
  const float* data = nullptr;
  int ld = 0;                       // Dense: the stored row length
  PaddedImages images;              // Patches
  PatchColumns columns = PatchColumns::Pixels;
  int rows = 0;                     // ImageRows: rows per image
  int64_t pixels = 0;               // ImageRows: columns per image

  // The stored row-major matrix at `data`, row length `ld`.
  static Operand dense(Trans t, const float* data, int ld) {
    Operand o;
    o.trans = t, o.data = data, o.ld = ld;
    return o;
  }
  // The patches matrix of padded images (see PatchColumns).
  static Operand patches(Trans t, const PaddedImages& images, PatchColumns columns) {
    Operand o;
    o.source = Source::Patches, o.trans = t, o.images = images, o.columns = columns;
    return o;
  }
  // Consecutive images of `rows` rows of `pixels` values each (an NCHW tensor's images
  // as [C][H*W]) as one matrix: D[row][j*pixels + p] = data[(j*rows + row)*pixels + p].
  static Operand image_rows(Trans t, const float* data, int rows, int64_t pixels) {
    Operand o;
    o.source = Source::ImageRows, o.trans = t, o.data = data, o.rows = rows, o.pixels = pixels;
    return o;
  }
};

// Told, after each column sliver of the last pass over C (the last k block and row
// block), how many of C's first columns are final, so a caller can use them while they
// are still in cache (the data gradient's col2im, kernels/cpu/conv.cpp). The count
// only grows, and the last call says N.
struct ColumnsDone {
  void (*call)(void* context, int columns) = nullptr;
  void* context = nullptr;
};

// C[M,N] = beta * C + op(A)[M,K] * op(B)[K,N] on any operands, by this CPU's path.
void gemm(int m, int n, int k, const Operand& a, const Operand& b, float beta, float* c, int ldc);
void gemm_with(CpuKernels path, int m, int n, int k, const Operand& a, const Operand& b, float beta, float* c,
               int ldc);
// C[M,N] = start + op(A)[M,K] * op(B)[K,N], each chain from `start` (values: M row or N
// column values, unused for Zero and C).
void gemm(int m, int n, int k, const Operand& a, const Operand& b, ChainStart start, const float* values, float* c,
          int ldc, const ColumnsDone& done = {});
void gemm_with(CpuKernels path, int m, int n, int k, const Operand& a, const Operand& b, ChainStart start,
               const float* values, float* c, int ldc, const ColumnsDone& done = {});

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
