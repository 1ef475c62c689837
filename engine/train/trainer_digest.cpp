// The Trainer's step digests (docs/replay.md): the record of every step, made from the
// sums the optimizer's update left (kernels/step_digest.h) and the few values the update
// does not pass (the batch norms' running statistics, the step's losses, the RNG and
// data positions).
#include "engine/train/trainer.h"

#include <algorithm>
#include <cstring>

#include "core/tensor_ops.h"
#include "engine/core/device.h"
#include "kernels/step_digest.h"

namespace engine {

bool Trainer::step_digests_on() const {
  // The CUDA step keeps its digests on the device (read at saves and epoch ends); until
  // that is in, a GPU run computes its checkpoints' digests from the state at the save.
  return cfg_.train.step_digests && device_.is_cpu();
}

void Trainer::record_step_digest() {
  const std::vector<std::string> names = optimizer_->parameter_names();
  const auto* sums = static_cast<const uint64_t*>(digest_sums_.raw());
  // Several ranks: each rank's update covered its shard only. The parameters are whole
  // again after the allgather, so they are hashed whole here (and compared between the
  // ranks); the moments' parts are added up in the run's agreement (complete_step_digest).
  const bool ranks = shards_ && shards_->world_size() > 1;
  StepDigest d;
  d.global_step = global_step_;
  d.epoch = epoch_ + 1;
  d.step_in_epoch = step_in_epoch_;
  d.shuffle_offset = epoch_shuffle_offset_;
  for (const auto& [name, value] : rng_.state().scalars)
    if (name != "seed" && std::holds_alternative<int64_t>(value))
      d.rng.emplace_back(name, static_cast<uint64_t>(std::get<int64_t>(value)));
  const int64_t n = epoch_sample_loss_.numel(), batch = cfg_.data.batch_size;
  const int64_t start = (step_in_epoch_ - 1) * batch, b = std::min(batch, n - start);
  d.loss = kernels::digest_floats(epoch_sample_loss_.f32() + start, b, static_cast<uint64_t>(start));
  std::map<std::string, std::size_t> slot;
  for (std::size_t i = 0; i < names.size(); ++i) slot[names[i]] = i;
  reuse_buffer(digest_whole_, {static_cast<int64_t>(sizeof(uint64_t))}, DType::U8, device_);
  for (const auto& [key, t] : model_->state().tensors) {
    auto it = slot.find(key);
    if (it != slot.end() && !ranks) {
      d.tensors.emplace_back("model/" + key, sums[3 * it->second]);
      continue;
    }
    // A buffer the step changed outside the optimizer (a batch norm's running
    // statistics), or a parameter the ranks' updates each covered a part of.
    digest_whole_.zero();
    tt::digest(t, 0, t.numel(), digest_whole_, 0);
    uint64_t whole = 0;
    device_copy(Device::cpu(), &whole, device_, digest_whole_.raw(), sizeof whole);
    d.tensors.emplace_back("model/" + key, whole);
  }
  digest_parts_.clear();
  for (std::size_t i = 0; i < names.size(); ++i) {
    d.tensors.emplace_back("optimizer/exp_avg/" + names[i], sums[3 * i + 1]);
    d.tensors.emplace_back("optimizer/exp_avg_sq/" + names[i], sums[3 * i + 2]);
    if (ranks) digest_parts_.insert(digest_parts_.end(), {sums[3 * i + 1], sums[3 * i + 2]});
  }
  std::sort(d.tensors.begin(), d.tensors.end());
  digest_awaits_ranks_ = ranks;
  last_digest_ = std::move(d);
  if (!ranks) hand_step_digest();
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
  // The moments' sums over the ranks, in the order record_step_digest gave its parts.
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
  // are named (with two ranks that differ, both); nothing of this state is saved.
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
  hand_step_digest();
}

void Trainer::hand_step_digest() {
  if (sink_) pending_digests_.push_back(*last_digest_);
}

uint64_t Trainer::step_digest() const {
  if (last_digest_ && !digest_awaits_ranks_ && last_digest_->global_step == global_step_)
    return last_digest_->combined();
  if (restored_digest_ && restored_digest_->first == global_step_) return restored_digest_->second;
  // Not recorded (train.step_digests off, a GPU run, no step yet): from the state as it
  // is, which is what the step left.
  Checkpoint c;
  c.config_json = config_json_;
  for (auto& [name, comp] : const_cast<Trainer*>(this)->builtin_components())
    if (name == "model" || name == "optimizer" || name == "rng")
      c.groups[name] = comp->state();
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
