// Test-only (engine_testing, never in libengine.a): a restore observer that throws after
// a chosen group has loaded, standing for a component that fails after it changed its
// state, so that a test can check that Trainer::restore rolls every change back.
#pragma once
#include <stdexcept>
#include <string>

#include "engine/train/trainer.h"

namespace engine::restore_faults {

class FailAfterGroup final : public RestoreObserver {
 public:
  explicit FailAfterGroup(std::string group) : group_(std::move(group)) {}
  void after_group(const std::string& group) override {
    if (group == group_) throw std::runtime_error("injected failure after loading " + group);
  }

 private:
  std::string group_;
};

}  // namespace engine::restore_faults
