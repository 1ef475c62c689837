#include "engine/core/parameter_shards.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace engine {

// ---- GradientParts ------------------------------------------------------------------

GradientParts::Entry& GradientParts::next(const Tensor& grad, bool wide, std::size_t blocks) {
  if (!grad.device().is_cpu())
    throw std::logic_error("GradientParts: deferred gradients are completed on the host; this one is on " +
                           grad.device().str());
  if (used_ == entries_.size()) entries_.emplace_back();
  Entry& e = entries_[used_++];
  e.grad = &grad;
  e.wide = wide;
  e.n = grad.numel();
  e.blocks = blocks;
  const std::size_t count = blocks * static_cast<std::size_t>(e.n);
  if (wide) e.d.resize(count);
  else e.f.resize(count);
  return e;
}

float* GradientParts::floats(const Tensor& grad, std::size_t blocks) { return next(grad, false, blocks).f.data(); }
double* GradientParts::doubles(const Tensor& grad, std::size_t blocks) { return next(grad, true, blocks).d.data(); }

const GradientParts::Entry* GradientParts::find(const Tensor& grad) const {
  for (std::size_t i = 0; i < used_; ++i)
    if (entries_[i].grad == &grad) return &entries_[i];
  return nullptr;
}

// ---- ParameterShards ----------------------------------------------------------------

ParameterShards::ParameterShards(std::vector<int64_t> sizes, Collective* comm)
    : sizes_(std::move(sizes)), comm_(comm) {
  if (comm_) {
    world_ = comm_->size();
    rank_ = comm_->rank();
  }
  for (int64_t s : sizes_) {
    if (s < 0) throw std::invalid_argument("ParameterShards: negative parameter size");
    starts_.push_back(total_);
    total_ += s;
  }
  for (int r = 0; r < world_; ++r) {
    std::vector<Segment> segs;
    const int64_t b = shard_begin(r), e = shard_begin(r + 1);
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      const int64_t lo = std::max(b, starts_[i]), hi = std::min(e, starts_[i] + sizes_[i]);
      if (lo < hi) segs.push_back({i, lo - starts_[i], hi - lo});
    }
    by_rank_.push_back(std::move(segs));
  }
}

int64_t ParameterShards::shard_begin(int rank) const { return total_ * rank / world_; }

int64_t ParameterShards::largest_shard() const {
  int64_t most = 0;
  for (int r = 0; r < world_; ++r) most = std::max(most, shard_size(r));
  return most;
}

namespace {
// The bytes one rank's block sums of `segments` take in an exchange piece: every
// deferred gradient's segment as `most_blocks` runs of its count, float or double.
std::size_t piece_bytes(const std::vector<ParameterShards::Segment>& segments, const GradientParts& parts,
                        const std::vector<Tensor*>& grads, std::size_t most_blocks) {
  std::size_t bytes = 0;
  for (const ParameterShards::Segment& s : segments)
    if (const GradientParts::Entry* e = parts.find(*grads[s.index]))
      bytes += most_blocks * static_cast<std::size_t>(s.count) * (e->wide ? sizeof(double) : sizeof(float));
  return bytes;
}

// One segment's block sums of every rank (in `recv`, rank r's at r * piece + at) added
// in tree order into grad[s.offset ...], through `scratch` (resized as needed).
template <class T>
void complete_segment(const BatchChunks& plan, const unsigned char* recv, std::size_t piece, std::size_t at,
                      int world, std::size_t most_blocks, const ParameterShards::Segment& s, float* grad,
                      std::vector<T>& scratch) {
  const std::size_t count = static_cast<std::size_t>(s.count), run = most_blocks * count;
  const std::size_t values = static_cast<std::size_t>(world) * run + count;
  if (scratch.size() < values) scratch.resize(values);
  T* gathered = scratch.data();
  T* sum = gathered + static_cast<std::size_t>(world) * run;
  for (int r = 0; r < world; ++r) std::memcpy(gathered + r * run, recv + r * piece + at, run * sizeof(T));
  plan.combine_gathered(gathered, s.count, sum);
  for (std::size_t k = 0; k < count; ++k) grad[static_cast<std::size_t>(s.offset) + k] = static_cast<float>(sum[k]);
}
}  // namespace

void ParameterShards::reduce_scatter(const BatchChunks& plan, const GradientParts& parts,
                                     const std::vector<Tensor*>& grads) const {
  if (grads.size() != sizes_.size())
    throw std::logic_error("ParameterShards: given " + std::to_string(grads.size()) + " gradients, built for " +
                           std::to_string(sizes_.size()));
  if (plan.world_size() != world_) throw std::logic_error("ParameterShards: the batch plan has another world size");
  const std::size_t most_blocks = static_cast<std::size_t>(plan.most_blocks()), mine = plan.blocks().size();
  std::size_t piece = 0;
  for (int r = 0; r < world_; ++r) piece = std::max(piece, piece_bytes(by_rank_[r], parts, grads, most_blocks));
  if (piece == 0) return;  // nothing deferred
  // Piece r of `send`: this rank's block sums of rank r's shard. The padding (blocks
  // this rank does not have, the end of a shorter shard's piece) is never read.
  const std::size_t bytes = piece * static_cast<std::size_t>(world_);
  if (send_.size() < bytes) send_.resize(bytes);
  for (int r = 0; r < world_; ++r) {
    unsigned char* p = send_.data() + static_cast<std::size_t>(r) * piece;
    for (const Segment& s : by_rank_[r]) {
      const GradientParts::Entry* e = parts.find(*grads[s.index]);
      if (!e) continue;
      if (e->blocks != mine || e->n != sizes_[s.index])
        throw std::logic_error("ParameterShards: parameter " + std::to_string(s.index) +
                               "'s block sums do not match the batch plan");
      const std::size_t el = e->wide ? sizeof(double) : sizeof(float);
      const std::size_t count = static_cast<std::size_t>(s.count);
      for (std::size_t b = 0; b < most_blocks; ++b, p += count * el) {
        if (b >= mine) continue;
        const std::size_t from = b * static_cast<std::size_t>(e->n) + static_cast<std::size_t>(s.offset);
        if (e->wide) std::memcpy(p, e->d.data() + from, count * el);
        else std::memcpy(p, e->f.data() + from, count * el);
      }
    }
  }
  const unsigned char* recv = send_.data();
  if (world_ > 1) {
    if (recv_.size() < bytes) recv_.resize(bytes);
    comm_->alltoall(send_.data(), piece, recv_.data());
    recv = recv_.data();
  }
  // Every rank's block sums of this rank's shard, in the same layout: add them in tree order.
  std::size_t at = 0;
  for (const Segment& s : segments()) {
    const GradientParts::Entry* e = parts.find(*grads[s.index]);
    if (!e) continue;
    float* g = grads[s.index]->f32();
    if (e->wide) complete_segment<double>(plan, recv, piece, at, world_, most_blocks, s, g, combine_d_);
    else complete_segment<float>(plan, recv, piece, at, world_, most_blocks, s, g, combine_f_);
    at += most_blocks * static_cast<std::size_t>(s.count) * (e->wide ? sizeof(double) : sizeof(float));
  }
}

std::vector<float> ParameterShards::gather(const float* shard) const {
  const std::size_t piece = static_cast<std::size_t>(largest_shard());
  std::vector<float> all(static_cast<std::size_t>(total_));
  if (world_ == 1) {
    std::copy(shard, shard + total_, all.begin());
    return all;
  }
  std::vector<float> send(piece, 0.0f), recv(piece * static_cast<std::size_t>(world_));
  std::copy(shard, shard + shard_size(rank_), send.begin());
  comm_->allgather(send.data(), piece * sizeof(float), recv.data());
  for (int r = 0; r < world_; ++r)
    std::copy(recv.begin() + static_cast<std::ptrdiff_t>(r * piece),
              recv.begin() + static_cast<std::ptrdiff_t>(r * piece + static_cast<std::size_t>(shard_size(r))),
              all.begin() + shard_begin(r));
  return all;
}

void ParameterShards::allgather(const std::vector<Tensor*>& values) const {
  if (values.size() != sizes_.size())
    throw std::logic_error("ParameterShards: given " + std::to_string(values.size()) + " parameters, built for " +
                           std::to_string(sizes_.size()));
  if (world_ == 1) return;
  const std::size_t piece = static_cast<std::size_t>(largest_shard());
  if (param_send_.size() < piece) param_send_.resize(piece);
  if (param_recv_.size() < piece * static_cast<std::size_t>(world_)) param_recv_.resize(piece * static_cast<std::size_t>(world_));
  float* send = param_send_.data();
  std::size_t at = 0;
  for (const Segment& s : segments()) {
    const float* v = values[s.index]->f32() + s.offset;
    std::copy(v, v + s.count, send + at);
    at += static_cast<std::size_t>(s.count);
  }
  comm_->allgather(send, piece * sizeof(float), param_recv_.data());
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const float* src = param_recv_.data() + static_cast<std::size_t>(r) * piece;
    for (const Segment& s : by_rank_[r]) {
      std::copy(src, src + s.count, values[s.index]->f32() + s.offset);
      src += s.count;
    }
  }
}

}  // namespace engine
