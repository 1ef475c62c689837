// The gradient exchange of a data-parallel step on CPU ranks, ZeRO stage 1
// (docs/distributed.md, "Sharded optimizer"). The parameters, end to end in the model's
// order, are one flat vector of P values; rank r of W owns its elements
// [P*r/W, P*(r+1)/W). After backward, one pass completes the gradients: each rank sends
// every other rank its block sums for that rank's shard (one alltoall), and each rank
// adds the W ranks' block sums of its own shard in the fixed tree order
// (BatchChunks::combine_gathered: the bits of one process). The optimizer then updates
// the shard with the shard's moments only, and one allgather returns every rank's
// updated shard to every rank. Per step a rank sends about 2 (W-1)/W gradients' bytes,
// where gathering everyone's partials sends W-1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/batch_chunks.h"
#include "engine/core/collective.h"
#include "engine/core/tensor.h"

namespace engine {

// The block sums a backward left to complete (BatchChunks::defer_gradients): for each
// gradient, its blocks' sums in block order, float (weights) or double (biases, summed
// in double and rounded to float once complete, as the layers do). Kept from step to
// step; clear() before each backward.
class GradientParts {
 public:
  // Room for `blocks` block sums of the grad.numel() values of `grad` (host memory),
  // valid until the next clear().
  float* floats(const Tensor& grad, std::size_t blocks);
  double* doubles(const Tensor& grad, std::size_t blocks);
  void clear() { used_ = 0; }

  struct Entry {
    const Tensor* grad = nullptr;
    bool wide = false;  // double block sums
    int64_t n = 0;
    std::size_t blocks = 0;
    std::vector<float> f;
    std::vector<double> d;
  };
  // The block sums of `grad` in this backward, or null (a gradient complete already).
  const Entry* find(const Tensor& grad) const;

 private:
  Entry& next(const Tensor& grad, bool wide, std::size_t blocks);
  std::vector<Entry> entries_;
  std::size_t used_ = 0;
};

class ParameterShards {
 public:
  // The flat vector of parameters of `sizes` elements each, over `comm`'s ranks (null:
  // one process, which owns everything).
  ParameterShards(std::vector<int64_t> sizes, Collective* comm);

  // Part of one parameter: its elements [offset, offset + count).
  struct Segment {
    std::size_t index = 0;
    int64_t offset = 0, count = 0;
  };
  // This rank's shard, parameter by parameter, in order.
  const std::vector<Segment>& segments() const { return by_rank_[static_cast<std::size_t>(rank_)]; }
  int64_t total() const { return total_; }
  int64_t shard_begin(int rank) const;
  int64_t shard_size(int rank) const { return shard_begin(rank + 1) - shard_begin(rank); }
  int world_size() const { return world_; }
  int rank() const { return rank_; }

  // Completes this rank's shard of every gradient found in `parts` into grads[i] (the
  // elements of its segments; the others are left as they are). A gradient not in
  // `parts` is complete already (batch norm's: its sums were completed in backward).
  void reduce_scatter(const BatchChunks& plan, const GradientParts& parts, const std::vector<Tensor*>& grads) const;
  // values[i]: parameter i, up to date in this rank's shard -> every rank's shard in
  // place on every rank.
  void allgather(const std::vector<Tensor*>& values) const;
  // shard: this rank's shard_size(rank()) values -> the whole flat vector on every rank.
  std::vector<float> gather(const float* shard) const;

 private:
  int64_t largest_shard() const;

  std::vector<int64_t> sizes_, starts_;
  int64_t total_ = 0;
  Collective* comm_;
  int world_ = 1, rank_ = 0;
  std::vector<std::vector<Segment>> by_rank_;  // every rank's segments
  // Exchange buffers kept from step to step: a few MB allocated and freed every step
  // would be page-faulted in again every step (glibc returns them to the kernel).
  mutable std::vector<unsigned char> send_, recv_;            // the alltoall's pieces
  mutable std::vector<float> combine_f_, param_send_, param_recv_;
  mutable std::vector<double> combine_d_;
};

}  // namespace engine
