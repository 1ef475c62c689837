#include "engine/batch_chunks.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/chunk_tree.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace engine {

static_assert(BatchChunks::kChunks == kernels::kTreeChunks, "one chunk count for the tree and the plan");

BatchChunks::BatchChunks(int64_t global_batch, Collective* comm) : global_(global_batch), comm_(comm) {
  if (global_batch < 0) throw std::invalid_argument("BatchChunks: negative batch size");
  if (comm_) {
    world_ = comm_->size();
    rank_ = comm_->rank();
  }
  require_valid_world_size(world_);
  chunks_ = kChunks / world_;
  const int first = kChunks * rank_ / world_;
  for (int c = 0; c <= chunks_; ++c) {
    bounds_global_[c] = kernels::tree_chunk_begin(global_, first + c);
    bounds_[c] = static_cast<int>(bounds_global_[c] - bounds_global_[0]);
  }
}

int64_t BatchChunks::rank_begin(int rank) const {
  return kernels::tree_chunk_begin(global_, kChunks * rank / world_);
}

template <class T>
void BatchChunks::complete(T* v, int64_t n) const {
  if (world_ == 1 || n == 0) return;
  std::vector<T> all(static_cast<std::size_t>(n) * world_);
  comm_->allgather(v, sizeof(T) * static_cast<std::size_t>(n), all.data());
  // The top of the tree over the W subtree sums (the same function as inside a rank).
  kernels::tree_sum_in_place(all.data(), world_, n, n);
  std::memcpy(v, all.data(), sizeof(T) * static_cast<std::size_t>(n));
}

void BatchChunks::complete_tree(float* v, int64_t n) const { complete(v, n); }
void BatchChunks::complete_tree(double* v, int64_t n) const { complete(v, n); }

void BatchChunks::complete_tree_device(float* v, int64_t n) const {
  if (world_ == 1 || n == 0) return;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n);
  // Freed stream-ordered: the tree kernel queued before the free has read it by then.
  struct Scratch {
    void* p;
    ~Scratch() { kernels::cuda::free(p); }
  } all{kernels::cuda::alloc(bytes * world_)};
  comm_->allgather_device(v, bytes, all.p);
  kernels::cuda::tree_sum_parts(world_, n, static_cast<const float*>(all.p), v);
}

template <class T>
void BatchChunks::gather(T* batch_values, int per_sample) const {
  if (world_ == 1) return;
  // Fixed-size pieces: every rank sends as many samples as the largest rank holds.
  int64_t most = 0;
  for (int r = 0; r < world_; ++r) most = std::max(most, rank_begin(r + 1) - rank_begin(r));
  const std::size_t piece = static_cast<std::size_t>(most) * per_sample;
  if (piece == 0) return;
  std::vector<T> send(piece, T{}), all(piece * world_);
  std::copy(batch_values + local_begin() * per_sample,
            batch_values + (local_begin() + local_count()) * per_sample, send.begin());
  comm_->allgather(send.data(), piece * sizeof(T), all.data());
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const int64_t b = rank_begin(r), e = rank_begin(r + 1);
    std::copy(all.begin() + r * piece, all.begin() + r * piece + (e - b) * per_sample,
              batch_values + b * per_sample);
  }
}

void BatchChunks::gather_samples(float* batch_values, int per_sample) const { gather(batch_values, per_sample); }
void BatchChunks::gather_samples(int32_t* batch_values, int per_sample) const { gather(batch_values, per_sample); }

}  // namespace engine
