// The engine's GEMM (kernels/cpu/gemm.h): packing, blocking and the choice of path.
// Only the micro-kernels (gemm_microkernels.h) are compiled for an instruction set, by
// function attributes, never by per-file flags: a file built with -mavx512f would also
// emit inline library templates (std::fill, ...) the linker may then hand to code that
// runs on any CPU.
//
// BLIS's loop order: C is cut into NC-wide column panels and KC-deep k blocks; a k block
// of op(B) is packed into NR-wide slivers, a MC x KC block of op(A) into MR-high
// slivers; the micro-kernel runs an MR x NR tile of C over the KC block, loading the
// tile (the chain so far), fusing KC multiply-adds into each element in k order, and
// storing it back (kernels/cpu/gemm.h).
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_microkernels.h"

namespace engine::kernels::cpu {

namespace {

constexpr int kKc = 256;   // k block: an A sliver and a B sliver stay in L1
constexpr int kMc = 96;    // rows of op(A) per packed block (L2)
constexpr int kNc = 2048;  // columns of op(B) per packed panel (L2/L3)

// Packs W-wide slivers of one operand for a k block:
//   dst[(s * kc + kk) * W + w] = X[first + s*W + w, k0 + kk], zero beyond `count`,
// where X is op(A) (W = MR, rows) or op(B) transposed (W = NR, columns): the same copy.
// `along_w`: the source holds X's w index contiguously (row kk of it at src + kk * ld),
// as a transposed A or an untransposed B does; otherwise X's k index is contiguous.
template <int W>
void pack(bool along_w, const float* src, int ld, int first, int count, int k0, int kc, float* dst_all) {
  for (int s = 0; s * W < count; ++s) {
    float* dst = dst_all + static_cast<int64_t>(s) * kc * W;
    const int width = std::min(W, count - s * W);
    const int base = first + s * W;
    if (along_w) {
      for (int kk = 0; kk < kc; ++kk) {
        const float* from = src + static_cast<int64_t>(k0 + kk) * ld + base;
        float* d = dst + kk * W;
        if (width == W) {
          std::memcpy(d, from, sizeof(float) * W);
          continue;
        }
        int w = 0;
        for (; w < width; ++w) d[w] = from[w];
        for (; w < W; ++w) d[w] = 0.0f;
      }
    } else {
      for (int w = 0; w < width; ++w) {
        const float* from = src + static_cast<int64_t>(base + w) * ld + k0;
        for (int kk = 0; kk < kc; ++kk) dst[kk * W + w] = from[kk];
      }
      for (int w = width; w < W; ++w)
        for (int kk = 0; kk < kc; ++kk) dst[kk * W + w] = 0.0f;
    }
  }
}

// Per-thread packing buffers, grown as needed (the GEMM runs inside the callers'
// OpenMP regions, one call per thread at a time).
template <class Kernel>
float* pack_buffer(int which, std::size_t floats) {
  struct Buffer {
    float* data = nullptr;
    std::size_t size = 0;
    ~Buffer() { ::operator delete[](data, std::align_val_t(64)); }
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[which];
  if (b.size < floats) {
    ::operator delete[](b.data, std::align_val_t(64));
    b.data = static_cast<float*>(::operator new[](floats * sizeof(float), std::align_val_t(64)));
    b.size = floats;
  }
  return b.data;
}

// Kernel: MR, NR, and
//   static void tile(int kc, const float* ap, const float* bp, float* c, int ldc, bool load_c)
// which runs a full MR x NR tile of C (load_c false: the chain starts from +0).
template <class Kernel>
void gemm_blocked(Trans ta, Trans tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                  float beta, float* c, int ldc) {
  constexpr int MR = Kernel::MR, NR = Kernel::NR;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // no multiply-add: C stays, or becomes +0
    if (beta == 0.0f)
      for (int i = 0; i < m; ++i) std::fill(c + static_cast<int64_t>(i) * ldc, c + static_cast<int64_t>(i) * ldc + n, 0.0f);
    return;
  }
  const int nc_max = std::min(n, kNc), mc_max = std::min(m, kMc);
  float* bp = pack_buffer<Kernel>(0, static_cast<std::size_t>((nc_max + NR - 1) / NR) * NR * kKc);
  float* ap = pack_buffer<Kernel>(1, static_cast<std::size_t>((mc_max + MR - 1) / MR) * MR * kKc);
  alignas(64) float edge[MR * NR];
  for (int j0 = 0; j0 < n; j0 += kNc) {
    const int nc = std::min(kNc, n - j0);
    for (int k0 = 0; k0 < k; k0 += kKc) {
      const int kc = std::min(kKc, k - k0);
      // The chain starts from C's value (beta 1, or any k block after the first),
      // else from +0.
      const bool load_c = beta != 0.0f || k0 > 0;
      pack<NR>(tb == Trans::No, b, ldb, j0, nc, k0, kc, bp);
      for (int i0 = 0; i0 < m; i0 += kMc) {
        const int mc = std::min(kMc, m - i0);
        pack<MR>(ta == Trans::Yes, a, lda, i0, mc, k0, kc, ap);
        for (int js = 0; js * NR < nc; ++js) {
          const int cols = std::min(NR, nc - js * NR);
          const float* bs = bp + static_cast<int64_t>(js) * kc * NR;
          for (int is = 0; is * MR < mc; ++is) {
            const int rows = std::min(MR, mc - is * MR);
            const float* as = ap + static_cast<int64_t>(is) * kc * MR;
            float* ct = c + static_cast<int64_t>(i0 + is * MR) * ldc + j0 + js * NR;
            if (rows == MR && cols == NR) {
              Kernel::tile(kc, as, bs, ct, ldc, load_c);
              continue;
            }
            // A ragged tile: through a full-size copy (the padding lanes are chains of
            // their own, computed and dropped).
            for (int r = 0; r < MR; ++r)
              for (int q = 0; q < NR; ++q)
                edge[r * NR + q] = (load_c && r < rows && q < cols) ? ct[static_cast<int64_t>(r) * ldc + q] : 0.0f;
            Kernel::tile(kc, as, bs, edge, NR, true);
            for (int r = 0; r < rows; ++r)
              std::memcpy(ct + static_cast<int64_t>(r) * ldc, edge + r * NR, sizeof(float) * cols);
          }
        }
      }
    }
  }
}

}  // namespace

void gemm_with(CpuKernels path, Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  switch (path) {
#if defined(__x86_64__)
    case CpuKernels::Avx512:
      gemm_blocked<Avx512Tile>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
      return;
    case CpuKernels::Avx2:
      gemm_blocked<Avx2Tile>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
      return;
    case CpuKernels::Portable:
      if (cpu_has_hardware_fma())
        gemm_blocked<PortableFmaTile>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
      else
        gemm_blocked<PortableTile>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
      return;
#endif
    default:  // Portable off x86-64 (the x86 paths: cpu_supports says no to them there)
      gemm_blocked<PortableTile>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
      return;
  }
}

void gemm_portable_software_fma(Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda,
                                const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_blocked<PortableTile>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
  static const CpuKernels path = cpu_kernels();
  gemm_with(path, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace engine::kernels::cpu
