// The fixed summation tree over batch chunks (docs/distributed.md). A batch is cut
// into kTreeChunks chunks; every cross-sample sum is the binary tree
//   ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))
// over the chunks' partial sums. A rank owning 8/W aligned chunks sums its subtree
// locally with the same function; the W subtree sums are then summed with it again,
// which is the same tree: hence the same bits at world sizes 1, 2, 4 and 8.
#pragma once
#include <cstdint>

#include "engine/hd.h"

namespace engine::kernels {

inline constexpr int kTreeChunks = 8;

// First sample of chunk `chunk` of an n-sample batch (chunk kTreeChunks gives n).
inline int tree_chunk_begin(int64_t n, int chunk) {
  return static_cast<int>(n * chunk / kTreeChunks);
}

// In-place tree sum of `count` (a power of two) equally long partial vectors: part[i]
// is at p + i * stride, `len` elements each; the result lands in part 0. Pairs
// (0,1), (2,3)..., then (0,2), (4,6)..., then (0,4): the tree above. Host and device
// (the CUDA chunked ops sum per-chunk partials with it, kernels/cuda/chunk_ops.cu).
template <class T>
ENGINE_HD void tree_sum_in_place(T* p, int count, int64_t stride, int64_t len) {
  for (int step = 1; step < count; step *= 2)
    for (int i = 0; i + step < count; i += 2 * step) {
      T* a = p + static_cast<int64_t>(i) * stride;
      const T* b = p + static_cast<int64_t>(i + step) * stride;
      for (int64_t j = 0; j < len; ++j) a[j] += b[j];
    }
}

// The tree sum of `count` scalars v[0], v[stride], ... (count a power of two).
template <class T>
T tree_sum(const T* v, int count, int64_t stride = 1) {
  if (count == 1) return v[0];
  const int half = count / 2;
  return tree_sum(v, half, stride) + tree_sum(v + half * stride, half, stride);
}

}  // namespace engine::kernels
