// The fixed summation tree over batch chunks (docs/distributed.md). A batch is cut
// into C chunks (config dist.chunks, a power of two; 8 by default); every cross-sample
// sum is the binary tree over the chunks' partial sums, for C = 8
//   ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)).
// A rank holds a contiguous range of chunks and sums each whole subtree in it (an
// aligned block of chunks) locally with the same function; the blocks of all ranks are
// then combined bottom-up (tree_combine_blocks), which is the same tree: hence the same
// bits at any world size W <= C, even splits or not.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kernels/hd.h"
#include "engine/kernels/tree_chunks.h"

namespace engine::kernels {

// kTreeChunks and kMaxTreeChunks: engine/kernels/tree_chunks.h.

// First sample of chunk `chunk` of an n-sample batch cut into `chunks` chunks (chunk
// `chunks` gives n).
inline int tree_chunk_begin(int64_t n, int chunk, int chunks = kTreeChunks) {
  return static_cast<int>(n * chunk / chunks);
}

// One whole subtree of the tree: the chunks [first, first + count), count a power of two
// and first a multiple of it.
struct TreeBlock {
  int first = 0, count = 0;
};

// The chunks [begin, end) as whole subtrees of at most `max_count` chunks, left to
// right: at each position the largest aligned block that fits.
inline std::vector<TreeBlock> tree_blocks(int begin, int end, int max_count = kTreeChunks) {
  std::vector<TreeBlock> out;
  for (int p = begin; p < end;) {
    int size = 1;
    while (size * 2 <= max_count && p % (size * 2) == 0 && p + size * 2 <= end) size *= 2;
    out.push_back({p, size});
    p += size;
  }
  return out;
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

// The tree's sum from blocks that cover all its chunks: part[i] (`len` values at
// parts + i * stride) is the sum over blocks[i]; blocks are whole subtrees, left to right,
// together exactly [0, total). Sibling blocks are added (left += right) smallest first
// until one is left, in part 0: every node of the tree is its left child plus its right
// child, as tree_sum_in_place computes it, so the bits do not depend on the blocks.
// Returns false when the blocks do not tile a tree (the parts are then partly summed).
template <class T>
bool tree_combine_blocks(T* parts, std::vector<TreeBlock> blocks, int64_t stride, int64_t len) {
  std::vector<int> slot(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) slot[i] = static_cast<int>(i);
  while (blocks.size() > 1) {
    int smallest = blocks[0].count;
    for (const TreeBlock& b : blocks) smallest = b.count < smallest ? b.count : smallest;
    std::vector<TreeBlock> next_blocks;
    std::vector<int> next_slot;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].count != smallest) {
        next_blocks.push_back(blocks[i]);
        next_slot.push_back(slot[i]);
        continue;
      }
      // A smallest block is a left child whose right sibling is the next block.
      if (blocks[i].first % (2 * smallest) != 0 || i + 1 >= blocks.size() ||
          blocks[i + 1].count != smallest || blocks[i + 1].first != blocks[i].first + smallest)
        return false;
      T* a = parts + static_cast<int64_t>(slot[i]) * stride;
      const T* b = parts + static_cast<int64_t>(slot[i + 1]) * stride;
      for (int64_t j = 0; j < len; ++j) a[j] += b[j];
      next_blocks.push_back({blocks[i].first, 2 * smallest});
      next_slot.push_back(slot[i]);
      ++i;
    }
    blocks.swap(next_blocks);
    slot.swap(next_slot);
  }
  // The leftmost block keeps its slot through every merge: the sum is in part 0.
  return blocks.size() == 1 && blocks[0].first == 0;
}

// The tree sum of `count` scalars v[0], v[stride], ... (count a power of two).
template <class T>
T tree_sum(const T* v, int count, int64_t stride = 1) {
  if (count == 1) return v[0];
  const int half = count / 2;
  return tree_sum(v, half, stride) + tree_sum(v + half * stride, half, stride);
}

}  // namespace engine::kernels
