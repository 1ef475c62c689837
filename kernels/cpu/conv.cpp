// Fast CPU convolution: implicit GEMM (the im2col matrix is packed straight from the
// images, never stored; kernels/cpu/gemm.h) over fixed chunks of the batch, chunks
// spread over OpenMP threads. The data gradient goes through a per-thread column
// buffer of a sub-batch and col2im. Weight/bias gradients are summed per chunk, then over the chunks in
// order, so the bits do not depend on the thread count.
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/chunk_tree.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"

namespace engine::kernels::cpu {

namespace {

#if defined(__x86_64__)
// The same sums gathered per output row: 16 columns of dx in a register take their
// contributions (r, q) in the same order, each a masked add of a shifted col row (lanes
// outside it keep their value, as col2im's loop leaves them), and are stored once. That
// loop writes each dx row 3 x 3 times at shifted offsets, and the reloads wait for
// those stores (col2im took a tenth of conv2's backward).
__attribute__((target("avx512f"))) void col2im_avx512(const ConvShape& s, const float* col, int64_t ld, float* dx) {
  const int oh_n = s.out_h(), ow_n = s.out_w();
  constexpr int kRows = 4;  // output rows at a time: independent chains of adds
  for (int c = 0; c < s.c; ++c)
    for (int ih0 = 0; ih0 < s.h; ih0 += kRows) {
      const int rows = std::min(kRows, s.h - ih0);
      for (int iw0 = 0; iw0 < s.w; iw0 += 16) {
        const int lanes = std::min(16, s.w - iw0);
        __m512 acc[kRows];
        for (int g = 0; g < kRows; ++g) acc[g] = _mm512_setzero_ps();
        for (int r = 0; r < s.r; ++r)
          for (int q = 0; q < s.s; ++q) {
            // dx column iw reads col column ow = iw + pad - q, where 0 <= ow < OW.
            const int lo = std::max(0, q - s.pad - iw0), hi = std::min(lanes, ow_n + q - s.pad - iw0);
            if (hi <= lo) continue;
            const __mmask16 m = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
            const float* tap = col + static_cast<int64_t>((c * s.r + r) * s.s + q) * ld + (iw0 + lo + s.pad - q);
            for (int g = 0; g < rows; ++g) {
              const int oh = ih0 + g + s.pad - r;
              if (oh < 0 || oh >= oh_n) continue;
              // Lane lo takes the first value read (an expanding load: no address
              // before the row).
              acc[g] = _mm512_mask_add_ps(acc[g], m, acc[g], _mm512_maskz_expandloadu_ps(m, tap + static_cast<int64_t>(oh) * ow_n));
            }
          }
        const __mmask16 all = static_cast<__mmask16>((1u << lanes) - 1);
        for (int g = 0; g < rows; ++g)
          _mm512_mask_storeu_ps(dx + (static_cast<int64_t>(c) * s.h + ih0 + g) * s.w + iw0, all, acc[g]);
      }
    }
}
#endif

// The adjoint of im2col: dx[c, ih, iw] = sum of the col entries that read it, each
// element's in tap order (r, q) from +0.
void col2im(const ConvShape& s, const float* col, int64_t ld, float* dx) {
#if defined(__x86_64__)
  static const bool avx512 = cpu_kernels() == CpuKernels::Avx512;
  if (avx512) return col2im_avx512(s, col, ld, dx);
#endif
  const int oh_n = s.out_h(), ow_n = s.out_w();
  std::memset(dx, 0, sizeof(float) * s.c * s.h * s.w);
  for (int c = 0; c < s.c; ++c)
    for (int r = 0; r < s.r; ++r)
      for (int q = 0; q < s.s; ++q) {
        const float* row = col + static_cast<int64_t>((c * s.r + r) * s.s + q) * ld;
        for (int oh = 0; oh < oh_n; ++oh) {
          const int ih = oh + r - s.pad;
          if (ih < 0 || ih >= s.h) continue;
          float* out = dx + (static_cast<int64_t>(c) * s.h + ih) * s.w;
          const float* in = row + oh * ow_n;
          const int lo = std::max(0, s.pad - q), hi = std::min(ow_n, s.w + s.pad - q);
          for (int ow = lo; ow < hi; ++ow) out[ow + q - s.pad] += in[ow];
        }
      }
}

// Images per forward or data-gradient GEMM inside a chunk: wide enough for the GEMM to
// run near peak, small enough that the per-thread buffers stay a few MB.
constexpr int kSubBatch = 8;

int max_chunk_images(int chunks, const int* bounds) {
  int most = 0;
  for (int c = 0; c < chunks; ++c) most = std::max(most, bounds[c + 1] - bounds[c]);
  return most;
}

// The fixed chunks of an n-sample batch: bounds[0..kTreeChunks].
struct StandardBounds {
  int b[kTreeChunks + 1];
  explicit StandardBounds(int n) {
    for (int c = 0; c <= kTreeChunks; ++c) b[c] = tree_chunk_begin(n, c);
  }
};

// The weight and bias gradients of each chunk of the batch (dw_chunks[chunk][K*CRS],
// db_chunks[chunk][K]) and dx, over the given chunk bounds. How the partials are then
// summed is the caller's: in sequence (conv2d_backward) or over the tree
// (conv2d_backward_chunks).
void backward_chunk_partials(const ConvShape& s, int chunks, const int* bounds, const float* x, const float* w,
                             const float* dy, float* dx, float* dw_chunks, double* db_chunks) {
  const int64_t ohw = static_cast<int64_t>(s.out_h()) * s.out_w();
  const int crs = s.c * s.r * s.s;
  const int64_t in_size = static_cast<int64_t>(s.c) * s.h * s.w;
  const int64_t out_size = s.k * ohw;
  const int64_t wsize = static_cast<int64_t>(s.k) * crs;
#pragma omp parallel
  {
    float* col = dx ? thread_scratch(Scratch::Work, static_cast<std::size_t>(crs * ohw * kSubBatch)) : nullptr;
    float* padded = thread_scratch(Scratch::PaddedImages, padded_images_floats(s, max_chunk_images(chunks, bounds)));
    float* dw_t = thread_scratch(Scratch::Output, static_cast<std::size_t>(wsize));
#pragma omp for schedule(static)
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int c0 = bounds[chunk], c1 = bounds[chunk + 1];
      // dW_chunk[K, CRS] = dy_c[K, n_c*OHW] * P_c^T[n_c*OHW, CRS]: one chain per weight
      // over the chunk's pixels, dy read in place and the patches from the padded
      // images (a chunk without images gets +0).
      const PaddedImages images = pad_images(s, x + c0 * in_size, c1 - c0, padded);
      // As dW^T[CRS, K] = P_c * dy_c^T (the same chains): the taps are the GEMM's rows,
      // packed 8 at a time (a narrow CRS, as conv1's 9, would leave most of a 32-wide
      // column sliver empty), then transposed into place.
      gemm(crs, s.k, static_cast<int>((c1 - c0) * ohw), Operand::patches(Trans::No, images, PatchColumns::Pixels),
           Operand::image_rows(Trans::Yes, dy + c0 * out_size, s.k, ohw), 0.0f, dw_t, s.k);
      float* dw_c = dw_chunks + chunk * wsize;
      for (int k = 0; k < s.k; ++k)
        for (int t = 0; t < crs; ++t) dw_c[static_cast<int64_t>(k) * crs + t] = dw_t[static_cast<int64_t>(t) * s.k + k];
      double* db_c = db_chunks + static_cast<int64_t>(chunk) * s.k;
      for (int n0 = c0; n0 < c1; n0 += kSubBatch) {
        const int nb = std::min(kSubBatch, c1 - n0);
        const int64_t ld = nb * ohw;
        for (int k = 0; k < s.k; ++k) {
          // The sub-batch's row of dy, its images one after another: 16 float lanes,
          // then double (vectorisable, fixed order).
          float lanes[16] = {};
          const int64_t full = ld / 16 * 16;
          double acc = 0.0;
          int64_t i = 0;  // the position in the sub-batch's row
          for (int j = 0; j < nb; ++j) {
            const float* row = dy + (n0 + j) * out_size + k * ohw;
            int64_t p = 0;
            for (; p < ohw && i % 16 != 0 && i < full; ++p, ++i) lanes[i % 16] += row[p];
            for (; p + 16 <= ohw && i + 16 <= full; p += 16, i += 16)
              for (int l = 0; l < 16; ++l) lanes[l] += row[p + l];
            for (; p < ohw && i < full; ++p, ++i) lanes[i % 16] += row[p];
            for (; p < ohw; ++p, ++i) acc += row[p];
          }
          for (int j = 0; j < 16; ++j) acc += lanes[j];
          db_c[k] += acc;
        }
        if (dx) {
          // col[CRS, nb*OHW] = W^T[CRS, K] * dy_c[K, nb*OHW], and each image's col2im as
          // soon as the GEMM has finished its columns, while they are in cache (after
          // the GEMM, col2im read the 1.8 MB of col back from beyond L2).
          struct Col2im {
            const ConvShape* s;
            const float* col;
            int64_t ld, ohw, in_size;
            float* dx;  // the sub-batch's first image
            int images, next = 0;
          } state{&s, col, ld, ohw, in_size, dx + n0 * in_size, nb};
          ColumnsDone done;
          done.context = &state;
          done.call = [](void* context, int columns) {
            Col2im& st = *static_cast<Col2im*>(context);
            for (; st.next < st.images && (st.next + 1) * st.ohw <= columns; ++st.next)
              col2im(*st.s, st.col + st.next * st.ohw, st.ld, st.dx + st.next * st.in_size);
          };
          gemm(crs, static_cast<int>(ld), s.k, Operand::dense(Trans::Yes, w, crs),
               Operand::image_rows(Trans::No, dy + n0 * out_size, s.k, ohw), ChainStart::Zero, nullptr, col,
               static_cast<int>(ld), done);
        }
      }
    }
  }
}

}  // namespace

// The whole batch is computed as its standard chunks: a sample's outputs do not depend
// on its chunk either way.
void conv2d_forward(const ConvShape& s, Precision p, BatchSplit split, const float* x, const float* w,
                    const float* b, float* y) {
  require_supported(cpu_op_supports, "cpu", OpId::conv2d_forward, p);
  const StandardBounds standard(s.n);
  const int chunks = split.whole() ? kTreeChunks : split.chunks;
  const int* bounds = split.whole() ? standard.b : split.bounds;
  const int64_t ohw = static_cast<int64_t>(s.out_h()) * s.out_w();
  const int crs = s.c * s.r * s.s;
  const int64_t in_size = static_cast<int64_t>(s.c) * s.h * s.w;
  const int wp = s.w + 2 * s.pad;
  const int64_t wide = static_cast<int64_t>(s.out_h()) * wp;  // columns per image at the padded width
#pragma omp parallel
  {
    float* out = thread_scratch(Scratch::Output, static_cast<std::size_t>(s.k * wide * kSubBatch));
    float* padded = thread_scratch(Scratch::PaddedImages, padded_images_floats(s, kSubBatch));
#pragma omp for schedule(static)
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int c0 = bounds[chunk], c1 = bounds[chunk + 1];
      for (int n0 = c0; n0 < c1; n0 += kSubBatch) {
        const int nb = std::min(kSubBatch, c1 - n0);
        const int64_t ld = nb * wide;
        const PaddedImages images = pad_images(s, x + n0 * in_size, nb, padded);
        // out[K, nb*OH*Wp] = b + W[K, CRS] * P[CRS, nb*OH*Wp], each chain from its
        // channel's bias: the patches at the padded width, each tap's row copied straight
        // from the padded images; the columns past OW in each row are not outputs and
        // are dropped.
        gemm(s.k, static_cast<int>(ld), crs, Operand::dense(Trans::No, w, crs),
             Operand::patches(Trans::No, images, PatchColumns::PaddedRows), b ? ChainStart::RowValues : ChainStart::Zero,
             b, out, static_cast<int>(ld));
        // Rows of OW floats (28, 14): a loop the compiler vectorises, not a memcpy call
        // per row (a call per 28 floats was 6 % of a training run's time).
        const int out_h = s.out_h(), out_w = s.out_w();
        for (int j = 0; j < nb; ++j)
          for (int k = 0; k < s.k; ++k) {
            float* to = y + ((n0 + j) * static_cast<int64_t>(s.k) + k) * ohw;
            const float* from = out + k * ld + j * wide;
            for (int oh = 0; oh < out_h; ++oh, to += out_w, from += wp)
              for (int ow = 0; ow < out_w; ++ow) to[ow] = from[ow];
          }
      }
    }
  }
}

void conv2d_backward(const ConvShape& s, Precision p, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  require_supported(cpu_op_supports, "cpu", OpId::conv2d_backward, p);
  const int64_t wsize = static_cast<int64_t>(s.k) * s.c * s.r * s.s;
  float* dw_chunks = thread_scratch(Scratch::ChunkGradients, static_cast<std::size_t>(kTreeChunks * wsize));
  std::vector<double> db_chunks(static_cast<std::size_t>(kTreeChunks) * s.k, 0.0);
  backward_chunk_partials(s, kTreeChunks, StandardBounds(s.n).b, x, w, dy, dx, dw_chunks, db_chunks.data());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < wsize; ++i) {
    float acc = 0.0f;
    for (int chunk = 0; chunk < kTreeChunks; ++chunk) acc += dw_chunks[chunk * wsize + i];
    dw[i] = acc;
  }
  if (db)
    for (int k = 0; k < s.k; ++k) {
      double acc = 0.0;
      for (int chunk = 0; chunk < kTreeChunks; ++chunk) acc += db_chunks[chunk * s.k + k];
      db[k] = static_cast<float>(acc);
    }
}

// conv2d_backward over the given chunks; the chunk partials are summed over the fixed
// tree (kernels/chunk_tree.h) instead of in sequence.
void conv2d_backward_chunks(const ConvShape& s, Precision p, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree,
                            double* db_tree) {
  require_supported(cpu_op_supports, "cpu", OpId::conv2d_backward_chunks, p);
  const int64_t wsize = static_cast<int64_t>(s.k) * s.c * s.r * s.s;
  float* dw_chunks = thread_scratch(Scratch::ChunkGradients, static_cast<std::size_t>(chunks * wsize));
  std::vector<double> db_chunks(static_cast<std::size_t>(chunks) * s.k, 0.0);
  backward_chunk_partials(s, chunks, bounds, x, w, dy, dx, dw_chunks, db_chunks.data());
  // The tree over the chunk partials, by slices of the weight (same bits as per element).
  constexpr int64_t kSlice = 4096;
  const int64_t slices = (wsize + kSlice - 1) / kSlice;
#pragma omp parallel for schedule(static)
  for (int64_t sl = 0; sl < slices; ++sl) {
    const int64_t j0 = sl * kSlice, len = std::min(kSlice, wsize - j0);
    tree_sum_in_place(dw_chunks + j0, chunks, wsize, len);
    std::memcpy(dw_tree + j0, dw_chunks + j0, sizeof(float) * len);
  }
  if (db_tree) {
    tree_sum_in_place(db_chunks.data(), chunks, s.k, s.k);
    std::copy(db_chunks.begin(), db_chunks.begin() + s.k, db_tree);
  }
}

}  // namespace engine::kernels::cpu
