// Fast CPU linear layer: sgemm over fixed blocks (of batch rows for y and dx, of output
// rows for dW), so every output element comes from the same call on any thread count.

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/chunk_tree.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace engine::kernels::cpu {

namespace {
int chunk_begin(int n, int chunk) { return static_cast<int>(static_cast<int64_t>(n) * chunk / kBatchChunks); }
}  // namespace

void linear_forward(const LinearShape& s, const float* x, const float* w, const float* b, float* y) {
  int bounds[kBatchChunks + 1];
  for (int c = 0; c <= kBatchChunks; ++c) bounds[c] = chunk_begin(s.n, c);
  linear_forward_chunks(s, kBatchChunks, bounds, x, w, b, y);
}

void linear_forward_chunks(const LinearShape& s, int chunks, const int* bounds, const float* x,
                           const float* w, const float* b, float* y) {
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int n0 = bounds[chunk], n1 = bounds[chunk + 1];
    if (n1 == n0) continue;
    float* yc = y + static_cast<int64_t>(n0) * s.out;
    for (int n = n0; n < n1; ++n)
      for (int o = 0; o < s.out; ++o) y[static_cast<int64_t>(n) * s.out + o] = b ? b[o] : 0.0f;
    // y[rows, OUT] += x[rows, IN] * W^T[IN, OUT]
    gemm(Trans::No, Trans::Yes, n1 - n0, s.out, s.in,
                x + static_cast<int64_t>(n0) * s.in, s.in, w, s.in, 1.0f, yc, s.out);
  }
}

void linear_backward(const LinearShape& s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < kBatchChunks; ++chunk) {
    // dW by fixed blocks of output rows, each summed over the whole batch in one GEMM:
    // no partial buffers, and the same calls (hence bits) for any thread count.
    const int o0 = chunk_begin(s.out, chunk), o1 = chunk_begin(s.out, chunk + 1);
    if (o1 > o0)
      // dW[o0:o1, IN] = dy[:, o0:o1]^T[rows, N] * x[N, IN]
      gemm(Trans::Yes, Trans::No, o1 - o0, s.in, s.n, dy + o0,
                  s.out, x, s.in, 0.0f, dw + static_cast<int64_t>(o0) * s.in, s.in);
    const int n0 = chunk_begin(s.n, chunk), n1 = chunk_begin(s.n, chunk + 1);
    if (dx && n1 > n0)
      // dx_c[rows, IN] = dy_c[rows, OUT] * W[OUT, IN]
      gemm(Trans::No, Trans::No, n1 - n0, s.in, s.out,
                  dy + static_cast<int64_t>(n0) * s.out, s.out, w, s.in, 0.0f,
                  dx + static_cast<int64_t>(n0) * s.in, s.in);
  }
  if (db)
    for (int o = 0; o < s.out; ++o) {
      double acc = 0.0;
      for (int n = 0; n < s.n; ++n) acc += dy[static_cast<int64_t>(n) * s.out + o];
      db[o] = static_cast<float>(acc);
    }
}

// dW by fixed blocks of output rows (in parallel); inside a block, one GEMM per chunk
// into a per-thread partial, then the fixed tree over the chunk partials while they are
// still in cache. The block height depends only on the layer's shape (never on the
// number of local chunks or threads), so every rank makes the same GEMM calls.
// dx and db per chunk, as in linear_backward.
void linear_backward_chunks(const LinearShape& s, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree,
                            double* db_tree) {
  // The 8 partials of a block within ~256 KB (L2).
  constexpr int64_t kBlockFloats = 65536;
  const int rows = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(s.out, kBlockFloats / (kTreeChunks * static_cast<int64_t>(s.in)))));
  const int blocks = (s.out + rows - 1) / rows;
#pragma omp parallel
  {
    float* parts = thread_scratch(0, static_cast<std::size_t>(chunks) * rows * s.in);
#pragma omp for schedule(static)
    for (int block = 0; block < blocks; ++block) {
      const int o0 = block * rows, o1 = std::min(s.out, o0 + rows);
      const int64_t len = static_cast<int64_t>(o1 - o0) * s.in;
      for (int c = 0; c < chunks; ++c) {
        const int n0 = bounds[c], n1 = bounds[c + 1];
        float* part = parts + c * len;
        if (n1 == n0) {
          std::fill(part, part + len, 0.0f);
          continue;
        }
        // part[o0:o1, IN] = dy_c[:, o0:o1]^T[rows, n_c] * x_c[n_c, IN]
        gemm(Trans::Yes, Trans::No, o1 - o0, s.in, n1 - n0,
                    dy + static_cast<int64_t>(n0) * s.out + o0, s.out,
                    x + static_cast<int64_t>(n0) * s.in, s.in, 0.0f, part, s.in);
      }
      tree_sum_in_place(parts, chunks, len, len);
      std::memcpy(dw_tree + static_cast<int64_t>(o0) * s.in, parts, sizeof(float) * len);
    }
#pragma omp for schedule(static)
    for (int c = 0; c < chunks; ++c) {
      const int n0 = bounds[c], n1 = bounds[c + 1];
      if (dx && n1 > n0)
        // dx_c[rows, IN] = dy_c[rows, OUT] * W[OUT, IN]
        gemm(Trans::No, Trans::No, n1 - n0, s.in, s.out,
                    dy + static_cast<int64_t>(n0) * s.out, s.out, w, s.in, 0.0f,
                    dx + static_cast<int64_t>(n0) * s.in, s.in);
    }
  }
  if (db_tree) {
    std::vector<double> db_parts(static_cast<std::size_t>(chunks) * s.out, 0.0);
    for (int c = 0; c < chunks; ++c)
      for (int n = bounds[c]; n < bounds[c + 1]; ++n)
        for (int o = 0; o < s.out; ++o)
          db_parts[static_cast<std::size_t>(c) * s.out + o] += dy[static_cast<int64_t>(n) * s.out + o];
    tree_sum_in_place(db_parts.data(), chunks, s.out, s.out);
    std::copy(db_parts.begin(), db_parts.begin() + s.out, db_tree);
  }
}

}  // namespace engine::kernels::cpu
