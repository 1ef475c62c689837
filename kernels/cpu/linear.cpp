// Fast CPU linear layer: the engine's GEMM, each output element one chain whichever
// thread or call computes it (y and dx: a GEMM per thread over its columns or rows;
// dW: fixed blocks), so the thread count changes no bit.

#include <algorithm>
#include <cstring>
#include <vector>

#include <omp.h>

#include "kernels/chunk_tree.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"

namespace engine::kernels::cpu {

namespace {
// The calling OpenMP thread's share of `rows` rows, cut at multiples of 8 (the widest
// micro-kernel's MR). Which thread computes a row changes no bit: each row's elements
// are chains of their own.
struct ThreadRows {
  int begin = 0, end = 0;
  explicit ThreadRows(int rows, int multiple = 8) {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    auto cut = [&](int i) {
      return i == threads ? rows : std::min(rows, static_cast<int>(static_cast<int64_t>(rows) * i / threads) / multiple * multiple);
    };
    begin = cut(t);
    end = cut(t + 1);
  }
};

// The threads split a product's columns (the widest micro-kernel's NR, 32, at a time)
// when each gets at least a sliver of them, else its rows. By columns, each thread packs
// only its share of W and runs it over every row: by rows, each packed all of W (fc1's
// forward and data gradient at batch 128 on 2 threads: W^T / W packed twice, 1.6 MB
// each). Which thread computes an element changes no bit: each is a chain of its own.
bool split_columns(int columns) { return columns >= 32 * omp_get_num_threads(); }
}  // namespace

// The whole batch is computed as its standard chunks.
void linear_forward(const LinearShape& s, Precision p, BatchSplit split, const float* x, const float* w,
                    const float* b, float* y) {
  require_supported(cpu_op_supports, "cpu", OpId::linear_forward, p);
  int standard[kTreeChunks + 1];
  for (int c = 0; c <= kTreeChunks; ++c) standard[c] = tree_chunk_begin(s.n, c);
  const int chunks = split.whole() ? kTreeChunks : split.chunks;
  const int* bounds = split.whole() ? standard : split.bounds;
  // Each y element is its bias plus one chain over IN, whatever rows share a GEMM: so
  // one GEMM per thread (over its columns or rows: split_columns), not one per chunk.
  const int first = bounds[0], rows = bounds[chunks] - first;
  if (rows <= 0) return;
#pragma omp parallel
  {
    const float* xr = x + static_cast<int64_t>(first) * s.in;
    float* yr = y + static_cast<int64_t>(first) * s.out;
    const ChainStart start = b ? ChainStart::ColumnValues : ChainStart::Zero;
    // y[rows, OUT] = b + x[rows, IN] * W^T[IN, OUT], each chain from its output's bias
    if (split_columns(s.out)) {
      const ThreadRows mine(s.out, 32);
      if (mine.end > mine.begin)
        gemm(rows, mine.end - mine.begin, s.in, Operand::dense(Trans::No, xr, s.in),
             Operand::dense(Trans::Yes, w + static_cast<int64_t>(mine.begin) * s.in, s.in), start,
             b ? b + mine.begin : nullptr, yr + mine.begin, s.out);
    } else {
      const ThreadRows mine(rows);
      if (mine.end > mine.begin)
        gemm(mine.end - mine.begin, s.out, s.in, Operand::dense(Trans::No, xr + static_cast<int64_t>(mine.begin) * s.in, s.in),
             Operand::dense(Trans::Yes, w, s.in), start, b, yr + static_cast<int64_t>(mine.begin) * s.out, s.out);
    }
  }
}

void linear_backward(const LinearShape& s, Precision p, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db) {
  require_supported(cpu_op_supports, "cpu", OpId::linear_backward, p);
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < kTreeChunks; ++chunk) {
    // dW by fixed blocks of output rows, each summed over the whole batch in one GEMM:
    // no partial buffers, and the same calls (hence bits) for any thread count.
    const int o0 = tree_chunk_begin(s.out, chunk), o1 = tree_chunk_begin(s.out, chunk + 1);
    if (o1 > o0)
      // dW[o0:o1, IN] = dy[:, o0:o1]^T[rows, N] * x[N, IN]
      gemm(Trans::Yes, Trans::No, o1 - o0, s.in, s.n, dy + o0,
                  s.out, x, s.in, 0.0f, dw + static_cast<int64_t>(o0) * s.in, s.in);
    const int n0 = tree_chunk_begin(s.n, chunk), n1 = tree_chunk_begin(s.n, chunk + 1);
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

// dW by fixed blocks of input columns (in parallel), all output rows in each: inside a
// block, one GEMM per chunk into a per-thread partial, then the fixed tree over the
// chunk partials while they are still in cache. The block width depends only on the
// layer's shape (never on the number of local chunks or threads), so every rank makes
// the same GEMM calls; a block's chunk GEMMs pack only its slice of x and the chunk's
// dy (a block of output rows would pack the whole x_c for every block).
// dx per thread over its rows, as in linear_forward; db per chunk.
void linear_backward_chunks(const LinearShape& s, Precision p, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree,
                            double* db_tree) {
  require_supported(cpu_op_supports, "cpu", OpId::linear_backward_chunks, p);
  // The 8 partials of a block within ~256 KB (L2).
  constexpr int64_t kBlockFloats = 65536;
  const int cols = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(s.in, kBlockFloats / (kTreeChunks * static_cast<int64_t>(s.out)))));
  const int blocks = (s.in + cols - 1) / cols;
  const int first = bounds[0], rows = bounds[chunks] - first;
#pragma omp parallel
  {
    float* parts = thread_scratch(Scratch::Work, static_cast<std::size_t>(chunks) * s.out * cols);
#pragma omp for schedule(static)
    for (int block = 0; block < blocks; ++block) {
      const int i0 = block * cols, width = std::min(s.in - i0, cols);
      const int64_t len = static_cast<int64_t>(s.out) * width;
      for (int c = 0; c < chunks; ++c) {
        const int n0 = bounds[c], n1 = bounds[c + 1];
        float* part = parts + c * len;
        if (n1 == n0) {
          std::fill(part, part + len, 0.0f);
          continue;
        }
        // part[OUT, i0:i0+width] = dy_c^T[OUT, n_c] * x_c[n_c, i0:i0+width]
        gemm(Trans::Yes, Trans::No, s.out, width, n1 - n0, dy + static_cast<int64_t>(n0) * s.out, s.out,
             x + static_cast<int64_t>(n0) * s.in + i0, s.in, 0.0f, part, width);
      }
      tree_sum_in_place(parts, chunks, len, len);
      for (int o = 0; o < s.out; ++o)
        std::memcpy(dw_tree + static_cast<int64_t>(o) * s.in + i0, parts + static_cast<int64_t>(o) * width,
                    sizeof(float) * width);
    }
    if (dx && rows > 0) {
      // dx[rows, IN] = dy[rows, OUT] * W[OUT, IN]
      const float* dyr = dy + static_cast<int64_t>(first) * s.out;
      float* dxr = dx + static_cast<int64_t>(first) * s.in;
      if (split_columns(s.in)) {
        const ThreadRows mine(s.in, 32);
        if (mine.end > mine.begin)
          gemm(Trans::No, Trans::No, rows, mine.end - mine.begin, s.out, dyr, s.out, w + mine.begin, s.in, 0.0f,
               dxr + mine.begin, s.in);
      } else {
        const ThreadRows mine(rows);
        if (mine.end > mine.begin)
          gemm(Trans::No, Trans::No, mine.end - mine.begin, s.in, s.out, dyr + static_cast<int64_t>(mine.begin) * s.out,
               s.out, w, s.in, 0.0f, dxr + static_cast<int64_t>(mine.begin) * s.in, s.in);
      }
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
