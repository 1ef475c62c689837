// Which samples of a global batch this rank computes, and how its partial sums become
// the whole batch's (docs/distributed.md). A batch of B samples is cut into 8 fixed
// chunks, chunk c = [B*c/8, B*(c+1)/8); rank r of W computes chunks [8r/W, 8(r+1)/W).
// Layers compute the tree sums over their local chunks (kernels/chunk_tree.h);
// complete_tree() exchanges the W subtree sums and adds the top of the tree, in the
// same order on every rank. With W = 1 nothing is exchanged and the bits are the same.
#pragma once
#include <cstdint>

#include "engine/collective.h"

namespace engine {

class BatchChunks {
 public:
  static constexpr int kChunks = 8;

  // The batch of `global_batch` samples split over `comm`'s ranks (null: one process).
  // The world size must divide kChunks (require_valid_world_size).
  BatchChunks(int64_t global_batch, Collective* comm = nullptr);

  int64_t global_batch() const { return global_; }
  // This rank's samples: [local_begin(), local_begin() + local_count()) of the batch.
  int64_t local_begin() const { return bounds_global_[0]; }
  int local_count() const { return static_cast<int>(bounds_global_[chunks_] - bounds_global_[0]); }
  // This rank's chunks, and their first samples relative to local_begin() (chunks()+1).
  int chunks() const { return chunks_; }
  const int* bounds() const { return bounds_; }
  int world_size() const { return world_; }
  bool distributed() const { return world_ > 1; }

  // v: n values, this rank's subtree sums -> the whole tree's sums, the same bits on
  // every rank (one allgather of n values). Nothing to do in one process.
  void complete_tree(float* v, int64_t n) const;
  void complete_tree(double* v, int64_t n) const;
  // The same for v in GPU memory (CUDA ranks): the W subtree sums gathered on the
  // device (Collective::allgather_device: NCCL, or staged through host memory) and the
  // top of the tree added in a kernel (kernels::cuda::tree_sum_parts).
  void complete_tree_device(float* v, int64_t n) const;
  // batch_values: the whole batch's per-sample values (global_batch() * per_sample),
  // of which this rank filled its own samples; receives every other rank's.
  void gather_samples(float* batch_values, int per_sample = 1) const;
  void gather_samples(int32_t* batch_values, int per_sample = 1) const;

 private:
  template <class T>
  void complete(T* v, int64_t n) const;
  template <class T>
  void gather(T* batch_values, int per_sample) const;
  int64_t rank_begin(int rank) const;

  int64_t global_;
  Collective* comm_;
  int world_ = 1, rank_ = 0, chunks_ = kChunks;
  int64_t bounds_global_[kChunks + 1];
  int bounds_[kChunks + 1];
};

}  // namespace engine
