// The Trainer's step digests (docs/replay.md): the record of every step, made from the
// sums the optimizer's update left (kernels/step_digest.h), the digests of what the update
// does not pass (the batch norms' running statistics, the step's losses), both collected
// by one launch at the step's end into a ring in device memory, and the host's part (the
// counters, the RNG and data positions). On a GPU the ring is read at saves and epoch
// ends: nothing in the step waits for it.
#include "engine/train/trainer.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/step_values.h"
#include "core/tensor_ops.h"
#include "engine/core/device.h"
#include "kernels/step_digest.h"

namespace engine {

bool Trainer::step_digests_on() const {
  // GPU ranks would need the moments' parts of every rank: one process only there.
  return cfg_.train.step_digests && (device_.is_cpu() || collective_->size() == 1);
}

void Trainer::prepare_step_digests() {
  const std::vector<std::string> names = optimizer_->parameter_names();
  const int64_t n_sums = 3 * static_cast<int64_t>(names.size());
  if (digest_sums_.defined() && digest_sums_.device() == device_ &&
      digest_sums_.numel() == n_sums * static_cast<int64_t>(sizeof(uint64_t)))
    return;
  // Made once (the first step, which a graph never captures): the buffers the ranges
  // point at are the model's own, updated in place.
  digest_sums_ = Tensor::zeros({n_sums * static_cast<int64_t>(sizeof(uint64_t))}, DType::U8, device_);
  digest_buffer_names_.clear();
  std::vector<kernels::DigestRange> ranges;
  for (const auto& [key, t] : model_->state().tensors) {
    if (std::find(names.begin(), names.end(), key) != names.end()) continue;
    if (t.dtype() != DType::F32 || t.device() != device_)
      throw std::logic_error("step digests: model buffer " + key + " is not float32 on the training device");
    digest_buffer_names_.push_back(key);
    ranges.push_back({t.f32(), t.numel()});
  }
  const int64_t range_bytes = static_cast<int64_t>(ranges.size() * sizeof(kernels::DigestRange));
  Tensor host = Tensor::empty({range_bytes}, DType::U8);
  if (range_bytes) std::memcpy(host.raw(), ranges.data(), static_cast<std::size_t>(range_bytes));
  digest_ranges_ = device_.is_cpu() ? host : host.to(device_);
  // Room for every step between two reads (an epoch's end reads them at the latest).
  digest_capacity_ = static_cast<int>(steps_per_epoch() + 2);
  const int64_t row = n_sums + static_cast<int64_t>(ranges.size()) + 1;
  digest_ring_ = Tensor::zeros({digest_capacity_ * row * static_cast<int64_t>(sizeof(uint64_t))}, DType::U8, device_);
  digest_next_ = Tensor::zeros({static_cast<int64_t>(sizeof(int64_t))}, DType::U8, device_);
  digest_rows_read_ = 0;
  digest_host_.clear();
}

void Trainer::finish_step_digests(int batch_total) {
  if (!optimizer_->has_digest_sums()) return;
  // The batch's first sample in the epoch: the step's uploaded value in one process (a
  // graph reads it there), the host's on CPU ranks (where the upload holds this rank's).
  const DeviceValue<int64_t> first = device_.is_cpu() ? DeviceValue<int64_t>{&digest_loss_first_, device_, {}}
                                                      : step_values_->sample_first();
  tt::step_digest_finish(digest_sums_, static_cast<int>(digest_buffer_names_.size()), digest_ranges_,
                         epoch_sample_loss_, first, batch_total, digest_ring_, digest_next_, digest_capacity_);
}

void Trainer::record_step_digest() {
  DigestHostPart h{global_step_, epoch_ + 1, step_in_epoch_, epoch_shuffle_offset_, {}};
  for (const auto& [name, value] : rng_.state().scalars)
    if (name != "seed" && std::holds_alternative<int64_t>(value))
      h.rng.emplace_back(name, static_cast<uint64_t>(std::get<int64_t>(value)));
  digest_host_.push_back(std::move(h));
  // The CPU reads its ring at once (nothing to wait for); a GPU at saves and epoch ends,
  // or when the ring would wrap.
  if (device_.is_cpu() || static_cast<int>(digest_host_.size()) + 1 >= digest_capacity_) drain_step_digests();
}

void Trainer::drain_step_digests() const {
  if (digest_host_.empty()) return;
  const std::vector<std::string> names = optimizer_->parameter_names();
  const std::size_t n_sums = 3 * names.size(), n_buffers = digest_buffer_names_.size();
  const std::size_t row = n_sums + n_buffers + 1;
  // The CPU's ring is read where it is; a GPU's comes back in one copy (a save or an
  // epoch's end, not the step).
  std::vector<uint64_t> copied;
  const uint64_t* ring = static_cast<const uint64_t*>(digest_ring_.raw());
  if (!device_.is_cpu()) {
    copied.resize(static_cast<std::size_t>(digest_capacity_) * row);
    device_copy(Device::cpu(), copied.data(), device_, digest_ring_.raw(), copied.size() * sizeof(uint64_t));
    ring = copied.data();
  }
  // Several ranks: each rank's update covered its shard only. The parameters are whole
  // again after the allgather, so they are hashed whole here (and compared between the
  // ranks); the moments' parts are added up in the run's agreement (complete_step_digest).
  const bool ranks = shards_ && shards_->world_size() > 1;
  for (const DigestHostPart& h : digest_host_) {
    const uint64_t* r = ring + static_cast<std::size_t>(digest_rows_read_ % digest_capacity_) * row;
    ++digest_rows_read_;
    StepDigest d;
    d.global_step = h.global_step;
    d.epoch = h.epoch;
    d.step_in_epoch = h.step_in_epoch;
    d.shuffle_offset = h.shuffle_offset;
    d.rng = h.rng;
    d.loss = r[n_sums + n_buffers];
    for (std::size_t i = 0; i < names.size(); ++i) {
      uint64_t param = r[3 * i];
      if (ranks) {
        Tensor& whole = const_cast<Trainer*>(this)->digest_whole_;
        reuse_buffer(whole, {static_cast<int64_t>(sizeof(uint64_t))}, DType::U8, device_);
        whole.zero();
        const Tensor& value = *param_values_[i];
        tt::digest(value, 0, value.numel(), whole, 0);
        std::memcpy(&param, whole.raw(), sizeof param);
      }
      d.tensors.emplace_back("model/" + names[i], param);
      d.tensors.emplace_back("optimizer/exp_avg/" + names[i], r[3 * i + 1]);
      d.tensors.emplace_back("optimizer/exp_avg_sq/" + names[i], r[3 * i + 2]);
    }
    for (std::size_t b = 0; b < n_buffers; ++b) d.tensors.emplace_back("model/" + digest_buffer_names_[b], r[n_sums + b]);
    std::sort(d.tensors.begin(), d.tensors.end());
    if (ranks) {
      digest_parts_.clear();
      for (std::size_t i = 0; i < names.size(); ++i) digest_parts_.insert(digest_parts_.end(), {r[3 * i + 1], r[3 * i + 2]});
    } else if (sink_) {
      pending_digests_.push_back(d);
    }
    digest_awaits_ranks_ = ranks;
    last_digest_ = std::move(d);
  }
  digest_host_.clear();
}

uint64_t Trainer::replica_digest() const {
  // The record without the moments (each rank holds only its shard of them).
  StepDigest replica = *last_digest_;
  replica.tensors.erase(std::remove_if(replica.tensors.begin(), replica.tensors.end(),
                                       [](const auto& t) { return t.first.rfind("optimizer/", 0) == 0; }),
                        replica.tensors.end());
  return replica.combined();
}

void Trainer::complete_step_digest(const std::vector<uint64_t>& parts, const std::vector<uint64_t>& replicas) {
  StepDigest& d = *last_digest_;
  // The moments' sums over the ranks, in the order drain_step_digests gave its parts.
  const std::vector<std::string> names = optimizer_->parameter_names();
  std::map<std::string, uint64_t> whole;
  for (std::size_t i = 0; i < names.size(); ++i) {
    whole["optimizer/exp_avg/" + names[i]] = parts.at(2 * i);
    whole["optimizer/exp_avg_sq/" + names[i]] = parts.at(2 * i + 1);
  }
  for (auto& [name, value] : d.tensors)
    if (auto it = whole.find(name); it != whole.end()) value = it->second;
  digest_awaits_ranks_ = false;
  // Every rank must hold the same replica. Those that differ from the most common digest
  // are named (when no digest has a majority, every rank); nothing of this state is saved.
  std::map<uint64_t, int> votes;
  for (const uint64_t r : replicas) ++votes[r];
  if (votes.size() > 1) {
    int most = 0;
    for (const auto& [value, count] : votes) most = std::max(most, count);
    int holders = 0;
    for (const auto& [value, count] : votes) holders += count == most;
    std::string odd;
    for (std::size_t r = 0; r < replicas.size(); ++r)
      if (holders > 1 || votes[replicas[r]] != most) odd += (odd.empty() ? "" : ", ") + std::to_string(r);
    throw ReplicaDivergence("rank " + std::to_string(collective_->rank()) + ": at global step " +
                            std::to_string(global_step_) + " (epoch " + std::to_string(d.epoch) + " step " +
                            std::to_string(d.step_in_epoch) + ") the state every rank holds differs on rank" +
                            (odd.find(',') == std::string::npos ? " " : "s ") + odd +
                            " (step digests); stopping without saving it: the last checkpoint is sound, resume "
                            "from it");
  }
  if (sink_) pending_digests_.push_back(d);
}

uint64_t Trainer::step_digest() const {
  drain_step_digests();
  if (last_digest_ && !digest_awaits_ranks_ && last_digest_->global_step == global_step_)
    return last_digest_->combined();
  if (restored_digest_ && restored_digest_->first == global_step_) return restored_digest_->second;
  // Not recorded (train.step_digests off, GPU ranks, no step yet): from the state as it
  // is, which is what the step left.
  Checkpoint c;
  c.config_json = config_json_;
  for (auto& [name, comp] : const_cast<Trainer*>(this)->builtin_components())
    if (name == "model" || name == "optimizer" || name == "rng") c.groups[name] = comp->state();
  StateDict counters;
  counters.scalars["epoch"] = epoch_;
  counters.scalars["global_step"] = global_step_;
  counters.scalars["step_in_epoch"] = step_in_epoch_;
  counters.scalars["epoch_shuffle_offset"] = static_cast<int64_t>(epoch_shuffle_offset_);
  counters.tensors["epoch_sample_loss"] = epoch_sample_loss_;
  c.groups["trainer"] = counters;
  return step_digest_of(c.to(Device::cpu()), "the trainer's state").combined();
}

}  // namespace engine
