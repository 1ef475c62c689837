// Adam and AdamW (PyTorch semantics; see kernels/elementwise.h adam_element). State is
// keyed by parameter name, never by position: exp_avg/<name>, exp_avg_sq/<name>, step/<name>.
#pragma once
#include <string>
#include <vector>

#include "engine/module.h"

namespace engine {

class AdamOptimizer : public Stateful {
 public:
  // name: "adamw" (decoupled weight decay) or "adam" (L2 added to the gradient).
  AdamOptimizer(const std::string& name, std::vector<Parameter*> params, double lr, double beta1,
                double beta2, double eps, double weight_decay);

  const std::string& name() const { return name_; }
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // One update of every parameter from its .grad.
  void step();
  // Re-creates the moments on the parameters' current device (after a model move).
  void to(Device device);

  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  struct Slot {
    Parameter* param;
    Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
  };
  std::string name_;
  double lr_, beta1_, beta2_, eps_, weight_decay_;
  std::vector<Slot> slots_;
};

}  // namespace engine
