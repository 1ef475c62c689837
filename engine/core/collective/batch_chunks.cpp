#include "engine/core/batch_chunks.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/chunk_tree.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace engine {


void require_world_size_fits(int world_size, int chunks) {
  if (chunks < 1 || chunks > kMaxTreeChunks || (chunks & (chunks - 1)) != 0)
    throw std::invalid_argument("dist.chunks = " + std::to_string(chunks) + " is not a power of two in 1 ... " +
                                std::to_string(kMaxTreeChunks));
  if (world_size > chunks)
    throw std::invalid_argument("world size " + std::to_string(world_size) + " is above dist.chunks = " +
                                std::to_string(chunks) + ": a batch is cut into that many fixed chunks and "
                                "each rank needs at least one; run on at most " + std::to_string(chunks) +
                                " ranks, or start a run with a larger dist.chunks (a power of two; "
                                "other bits than a run with " + std::to_string(chunks) + ")");
}

BatchChunks::BatchChunks(int64_t global_batch, Collective* comm, int chunks)
    : global_(global_batch), comm_(comm), total_chunks_(chunks) {
  if (global_batch < 0) throw std::invalid_argument("BatchChunks: negative batch size");
  if (comm_) {
    world_ = comm_->size();
    rank_ = comm_->rank();
  }
  require_world_size_fits(world_, total_chunks_);
  const int64_t base = rank_begin(rank_);
  for (const kernels::TreeBlock& t : kernels::tree_blocks(rank_first_chunk(rank_), rank_first_chunk(rank_ + 1))) {
    Block b;
    b.first_chunk = t.first;
    b.chunks = t.count;
    b.begin = static_cast<int>(kernels::tree_chunk_begin(global_, t.first, total_chunks_) - base);
    for (int c = 0; c <= t.count; ++c)
      b.bounds.push_back(static_cast<int>(kernels::tree_chunk_begin(global_, t.first + c, total_chunks_) - base) -
                         b.begin);
    b.count = b.bounds.back();
    blocks_.push_back(std::move(b));
  }
  for (int r = 0; r < world_; ++r)
    most_blocks_ = std::max(most_blocks_, static_cast<int>(kernels::tree_blocks(rank_first_chunk(r),
                                                                                 rank_first_chunk(r + 1)).size()));
}

int BatchChunks::rank_first_chunk(int rank) const {
  return static_cast<int>(static_cast<int64_t>(total_chunks_) * rank / world_);
}

int64_t BatchChunks::rank_begin(int rank) const {
  return kernels::tree_chunk_begin(global_, rank_first_chunk(rank), total_chunks_);
}

template <class T>
void BatchChunks::complete_impl(const T* parts, int64_t n, T* out) const {
  if (n == 0) return;
  const std::size_t len = static_cast<std::size_t>(n);
  if (!needs_completion()) {
    if (out != parts) std::memcpy(out, parts, sizeof(T) * len);
    return;
  }
  // In one process this rank's blocks are already the whole tiling (most_blocks_ of them).
  if (world_ == 1) {
    std::vector<T> blocks(parts, parts + blocks_.size() * len);
    return combine_in_place(blocks.data(), n, out);
  }
  // Fixed-size pieces: every rank sends as many block sums as the rank with the most.
  const std::size_t piece = static_cast<std::size_t>(most_blocks_) * len;
  std::vector<T> send(piece, T{}), gathered(piece * world_);
  std::copy(parts, parts + blocks_.size() * len, send.begin());
  comm_->allgather(send.data(), piece * sizeof(T), gathered.data());
  combine_in_place(gathered.data(), n, out);
}

template <class T>
void BatchChunks::combine_in_place(T* gathered, int64_t n, T* out) const {
  if (n == 0) return;
  const std::size_t len = static_cast<std::size_t>(n), piece = static_cast<std::size_t>(most_blocks_) * len;
  // Every rank's blocks in global order, part i of the tiling at gathered + i * n: the
  // padding is squeezed out by moving blocks down (never up, so in place), with no
  // second buffer (this runs on the gradient's whole shard every step).
  std::vector<kernels::TreeBlock> tiling;
  std::size_t at = 0;
  for (int r = 0; r < world_; ++r) {
    const auto rank_blocks = kernels::tree_blocks(rank_first_chunk(r), rank_first_chunk(r + 1));
    for (std::size_t i = 0; i < rank_blocks.size(); ++i, at += len) {
      tiling.push_back(rank_blocks[i]);
      const T* src = gathered + r * piece + i * len;
      if (src != gathered + at) std::memmove(gathered + at, src, sizeof(T) * len);
    }
  }
  if (!kernels::tree_combine_blocks(gathered, tiling, n, n))
    throw std::logic_error("BatchChunks: the ranks' blocks do not tile the tree of " +
                           std::to_string(total_chunks_) + " chunks");
  if (out != gathered) std::memcpy(out, gathered, sizeof(T) * len);
}

void BatchChunks::combine_gathered(float* gathered, int64_t n, float* out) const {
  combine_in_place(gathered, n, out);
}
void BatchChunks::combine_gathered(double* gathered, int64_t n, double* out) const {
  combine_in_place(gathered, n, out);
}

void BatchChunks::complete(const float* parts, int64_t n, float* out) const { complete_impl(parts, n, out); }
void BatchChunks::complete(const double* parts, int64_t n, double* out) const { complete_impl(parts, n, out); }

void BatchChunks::complete_device(const float* parts, int64_t n, float* out) const {
  if (n == 0) return;
  if (!needs_completion()) {
    if (out != parts)
      kernels::cuda::copy(out, parts, sizeof(float) * static_cast<std::size_t>(n), kernels::cuda::CopyKind::DeviceToDevice);
    return;
  }
  // Host staging: the combine adds in the same order on the host as a kernel would, and
  // float addition is the same operation there, so the bits are those of the tree.
  const std::size_t local = blocks_.size() * static_cast<std::size_t>(n);
  std::vector<float> host(local);
  kernels::cuda::copy(host.data(), parts, sizeof(float) * local, kernels::cuda::CopyKind::DeviceToHost);
  complete_impl(host.data(), n, host.data());
  kernels::cuda::copy(out, host.data(), sizeof(float) * static_cast<std::size_t>(n), kernels::cuda::CopyKind::HostToDevice);
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

void BatchChunks::gather_samples_device(float* batch_values, int per_sample) const {
  if (world_ == 1) return;
  const std::size_t all = static_cast<std::size_t>(global_) * static_cast<std::size_t>(per_sample);
  const std::size_t mine = static_cast<std::size_t>(local_begin()) * static_cast<std::size_t>(per_sample);
  const std::size_t count = static_cast<std::size_t>(local_count()) * static_cast<std::size_t>(per_sample);
  std::vector<float> host(all);
  if (count)
    kernels::cuda::copy(host.data() + mine, batch_values + mine, sizeof(float) * count,
                        kernels::cuda::CopyKind::DeviceToHost);
  gather(host.data(), per_sample);
  if (all) kernels::cuda::copy(batch_values, host.data(), sizeof(float) * all, kernels::cuda::CopyKind::HostToDevice);
}
void BatchChunks::gather_samples(int32_t* batch_values, int per_sample) const { gather(batch_values, per_sample); }

}  // namespace engine
