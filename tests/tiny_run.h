// A tiny CPU run of the default model, and two states compared bit for bit: for the
// library tests of training and its run directory that build their own Trainer.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "run_dir_util.h"

namespace test_util {

// A tiny CPU run: 512 training images in batches of 64 (8 steps per epoch), 2 epochs.
inline engine::Config tiny_config(const std::string& run_dir, int64_t train_limit = 512) {
  return small_run_config("cpu", run_dir, train_limit);
}

// Every tensor and scalar of every group, bit for bit (the config text aside).
inline void expect_same_state(const engine::Checkpoint& a, const engine::Checkpoint& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.groups.size() == b.groups.size());
  for (const auto& [name, ga] : a.groups) {
    CAPTURE(name);
    const engine::StateDict& gb = b.groups.at(name);
    CHECK(engine::compare_state(ga, gb).clean());
    for (const auto& [k, t] : ga.tensors) {
      CAPTURE(k);
      const std::vector<float> va = t.to_vector(), vb = gb.tensors.at(k).to_vector();
      CHECK((va.size() == vb.size() && std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0));
    }
    for (const auto& [k, s] : ga.scalars) {
      CAPTURE(k);
      if (name == "metrics" && k == "epoch_seconds") continue;  // wall-clock times
      // Derived: fit() sets it from the scheduler at the start of each epoch.
      if (name == "optimizer" && k == "lr") continue;
      CHECK(s == gb.scalars.at(k));
    }
  }
}

}  // namespace test_util
