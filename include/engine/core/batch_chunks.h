// Which samples of a global batch this rank computes, and how its partial sums become
// the whole batch's (docs/distributed.md). A batch of B samples is cut into C fixed
// chunks (config dist.chunks, a power of two; 8 by default), chunk c = [B*c/C, B*(c+1)/C);
// rank r of W (W <= C) computes chunks [C*r/W, C*(r+1)/W), even splits or not. A layer
// computes its rank's chunks block by block, a block being a whole subtree of the fixed
// tree (at most 8 chunks: what one call of a chunked op takes); complete() exchanges
// every rank's block sums and combines them into the tree's, in the same order on every
// rank. With one block in one process nothing is exchanged or combined.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/core/collective.h"
#include "engine/kernels/tree_chunks.h"

namespace engine {

class GradientParts;
class StepValues;

class BatchChunks {
 public:
  // The chunks of a batch unless the config says otherwise (dist.chunks).

  // One whole subtree of this rank's chunks: `chunks` of them from global chunk
  // `first_chunk`, samples [begin, begin + count) of this rank's local batch;
  // bounds[0..chunks] are its chunks' first samples relative to `begin`.
  struct Block {
    int first_chunk = 0, chunks = 0;
    int begin = 0, count = 0;
    std::vector<int> bounds;
  };

  // The batch of `global_batch` samples in `chunks` chunks, split over `comm`'s ranks
  // (null: one process). Throws std::invalid_argument when `chunks` is not a power of
  // two in 1..1024, or is below the world size (naming dist.chunks).
  BatchChunks(int64_t global_batch, Collective* comm = nullptr, int chunks = kTreeChunks);

  int64_t global_batch() const { return global_; }
  int total_chunks() const { return total_chunks_; }
  // This rank's samples: [local_begin(), local_begin() + local_count()) of the batch.
  int64_t local_begin() const { return rank_begin(rank_); }
  int local_count() const { return static_cast<int>(rank_begin(rank_ + 1) - rank_begin(rank_)); }
  // This rank's chunks as whole subtrees, left to right (one block when its chunks are
  // one aligned run of at most 8, as in one process with dist.chunks = 8).
  const std::vector<Block>& blocks() const { return blocks_; }
  int world_size() const { return world_; }
  bool distributed() const { return world_ > 1; }
  // Whether every rank runs on this host (Collective::one_host; yes in one process).
  bool one_host() const { return comm_ == nullptr || comm_->one_host(); }
  // Whether a cross-sample sum needs complete(): more than one block in the whole job.
  bool needs_completion() const { return world_ > 1 || blocks_.size() > 1; }

  // parts: blocks().size() vectors of n values (this rank's block sums, in block order,
  // part i at parts + i * n) -> out (n values): the whole tree's sums, the same bits on
  // every rank (one allgather). `out` may be `parts`.
  void complete(const float* parts, int64_t n, float* out) const;
  void complete(const double* parts, int64_t n, double* out) const;
  // The same with parts and out in GPU memory (CUDA ranks): staged through host memory.
  void complete_device(const float* parts, int64_t n, float* out) const;
  // The block sums of every rank as complete() exchanges them (rank r's blocks in order
  // at gathered + r * most_blocks() * n, padded with unused ones) -> out (n values):
  // their tree sum. `gathered` is overwritten (the combine runs in it); `out` may be
  // `gathered`. What ParameterShards combines after its alltoall.
  void combine_gathered(float* gathered, int64_t n, float* out) const;
  void combine_gathered(double* gathered, int64_t n, double* out) const;
  // The most blocks any rank holds (the exchanges' fixed piece size, in blocks).
  int most_blocks() const { return most_blocks_; }

  // Weight and bias gradients left to one pass after backward (ParameterShards, on the
  // CPU): a layer that finds GradientParts here writes its block sums into them instead
  // of completing them itself. Null (the default): each layer completes its own.
  void defer_gradients(GradientParts* parts) { deferred_ = parts; }
  GradientParts* deferred_gradients() const { return deferred_; }
  // The step's values in device memory (engine/core/step_values.h), which ops read
  // rather than take as arguments (dropout's counter). Null (the default): such an op
  // sends its value itself.
  void use_step_values(const StepValues* values) { step_values_ = values; }
  const StepValues* step_values() const { return step_values_; }
  // batch_values: the whole batch's per-sample values (global_batch() * per_sample),
  // of which this rank filled its own samples; receives every other rank's.
  void gather_samples(float* batch_values, int per_sample = 1) const;
  void gather_samples(int32_t* batch_values, int per_sample = 1) const;
  // The same with batch_values in GPU memory (CUDA ranks): staged through host memory.
  void gather_samples_device(float* batch_values, int per_sample = 1) const;

 private:
  template <class T>
  void complete_impl(const T* parts, int64_t n, T* out) const;
  template <class T>
  void combine_in_place(T* gathered, int64_t n, T* out) const;
  template <class T>
  void gather(T* batch_values, int per_sample) const;
  int64_t rank_begin(int rank) const;
  int rank_first_chunk(int rank) const;

  int64_t global_;
  Collective* comm_;
  int world_ = 1, rank_ = 0, total_chunks_ = kTreeChunks;
  std::vector<Block> blocks_;
  // Every rank's blocks (global chunk ranges), in rank order: the tree's tiling.
  std::vector<int> rank_block_count_;
  int most_blocks_ = 1;
  GradientParts* deferred_ = nullptr;
  const StepValues* step_values_ = nullptr;
};

// Throws std::invalid_argument unless `chunks` (dist.chunks) is a power of two in
// 1..1024 and at least `world_size`; the message names the key and the ranks.
void require_world_size_fits(int world_size, int chunks);

}  // namespace engine
