// Adam and AdamW (PyTorch semantics; see kernels/elementwise.h adam_element). State is
// keyed by parameter name, never by position: exp_avg/<name>, exp_avg_sq/<name>, step/<name>.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/core/parameter_shards.h"

namespace engine {

class StepValues;

class AdamOptimizer : public Stateful {
 public:
  // name: "adamw" (decoupled weight decay) or "adam" (L2 added to the gradient).
  AdamOptimizer(const std::string& name, std::vector<Parameter*> params, double lr, double beta1,
                double beta2, double eps, double weight_decay);

  const std::string& name() const { return name_; }
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // One update of every parameter from its .grad (sharded: of this rank's shard only,
  // from the shard of .grad that ParameterShards::reduce_scatter completed).
  void step();
  // The same in two halves, for a caller that sends the step's values itself (the
  // Trainer, engine/core/step_values.h): prepare_step writes the next update's factors
  // (learning rate and bias corrections, one per tensor) into values.adam; step(values)
  // runs the update reading them from the values' upload.
  void prepare_step(StepValues& values) const;
  void step(const StepValues& values);
  // The host's part of a step whose device work a CUDA graph replays
  // (engine/train/step_graphs.h): after a step(values), each tensor's step count on the
  // host; after a step_on_device, none: the graph counted them on the device, or did not
  // (a skipped step), so the host's copy is older than the device's from here.
  enum class StepCounts { OnHost, OnDevice };
  void replayed_step(StepCounts counts);
  // The same update with the step counts kept on the device, for a loss scaler that may
  // skip the step there (nothing read back): the factors are made on the device after
  // the overflow check, from values.scalars.lr as uploaded; no update and no count when
  // *skip. The counts come back to the host for state() (a copy that waits for the device).
  void step_on_device(const StepValues& values, DeviceValue<int32_t> skip);
  // Re-creates the moments on the parameters' current device (after a model move).
  void to(Device device);

  // ZeRO stage 1 (docs/distributed.md): keeps only this rank's shard of the moments
  // (`shards` over the same parameters, in the same order; CPU), and from then on updates
  // only that shard. Local: nothing is exchanged.
  void shard(const ParameterShards& shards);
  // Gathers every rank's shard: the whole moments on every rank again, unsharded (a
  // collective: every rank calls it at the same point).
  void unshard(const ParameterShards& shards);
  bool sharded() const { return sharded_; }
  // The bytes of the moments this rank holds, and of the whole moments state() gives.
  int64_t moment_bytes() const;
  int64_t state_bytes() const;

  // Step digests (kernels/step_digest.h): with `sums` (a U8 tensor of 3 uint64 per
  // parameter, on the parameters' device), every step adds to sums [3i, 3i+3) the
  // digests of parameter i's updated elements and their two moments (this rank's shard
  // only when sharded; index: the element's place in the whole parameter). The caller
  // zeroes them between steps. Null: none (the default).
  void set_digest_sums(Tensor* sums) { digest_sums_ = sums; }
  bool has_digest_sums() const { return digest_sums_ != nullptr; }
  // The parameters' names, in the order of the sums.
  std::vector<std::string> parameter_names() const;

  // The whole moments: unsharded only (a sharded optimizer throws std::logic_error; the
  // Trainer gathers the shards before a save and when fit() returns).
  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  struct Slot {
    Parameter* param;
    Tensor exp_avg, exp_avg_sq;  // sharded: the `count` moments of elements [offset, offset + count)
    int64_t step = 0;
    int64_t offset = 0, count = -1;  // -1: the whole parameter
  };
  void require_whole(const char* what) const;
  std::string name_;
  double lr_, beta1_, beta2_, eps_, weight_decay_;
  // Reads the step counts back from the device when they are newer there.
  void pull_steps() const;
  mutable std::vector<Slot> slots_;
  bool sharded_ = false;
  Tensor device_steps_, device_factors_;  // step_on_device's: int64[n] and AdamStepFactors[n], as bytes
  Tensor* digest_sums_ = nullptr;
  enum class Newer { Same, Host, Device };
  mutable Newer steps_newer_ = Newer::Same;
  std::shared_ptr<StepValues> own_values_;  // step()'s
};

}  // namespace engine
