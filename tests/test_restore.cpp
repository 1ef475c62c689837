// Trainer::restore: the scaler's state follows the config, the partial-epoch loss buffer
// changes size only at an epoch boundary, and a restore that fails rolls back every
// component it touched.
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/io/checkpoint.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "support/restore_faults.h"
#include "tiny_run.h"

using namespace engine;
using namespace test_util;

namespace {

// snapshot() aliases the live tensors: a copy that later changes cannot reach.
Checkpoint deep_snapshot(Trainer& t) {
  Checkpoint c = t.snapshot();
  for (auto& [name, g] : c.groups)
    for (auto& [k, tensor] : g.tensors) tensor = tensor.clone();
  return c;
}

}  // namespace

TEST_CASE("Trainer::restore: scaler state follows the config; the loss buffer may change size only at an epoch boundary") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_restore");
  const Config fp32_cfg = tiny_config(dir + "/a");
  Trainer fp32(fp32_cfg, Device::cpu(), make_model(fp32_cfg));
  Config fp16_cfg = tiny_config(dir + "/b");
  fp16_cfg.precision.mode = engine::Precision::Fp16;
  Trainer fp16(fp16_cfg, Device::cpu(), make_model(fp16_cfg));
  CHECK(fp16.restore(fp32.snapshot(), LoadMode::Strict).clean());
  const StateDict scaler = fp16.snapshot().groups.at("scaler");
  CHECK(scaler.get_int("enabled") == 1);
  CHECK(scaler.get_real("scale") == fp16_cfg.precision.loss_scale.init);

  // Epoch boundary (step_in_epoch 0): another training-set size is accepted.
  const Config smaller_cfg = tiny_config(dir + "/c", 384);
  Trainer smaller(smaller_cfg, Device::cpu(), make_model(smaller_cfg));
  Checkpoint at_boundary = fp32.snapshot();
  REQUIRE(at_boundary.groups.at("trainer").get_int("step_in_epoch") == 0);
  at_boundary.groups.at("trainer").scalars["epoch"] = int64_t{1};
  at_boundary.groups.at("trainer").scalars["global_step"] = int64_t{8};
  CHECK(smaller.restore(at_boundary, LoadMode::Strict).clean());
  CHECK(smaller.epochs_done() == 1);
  CHECK(smaller.snapshot().groups.at("trainer").get_tensor("epoch_sample_loss").numel() == 384);

  // Mid-epoch: refused, saying why; nothing changes.
  Checkpoint mid = at_boundary;
  mid.groups.at("trainer").scalars["step_in_epoch"] = int64_t{3};
  mid.groups.at("trainer").scalars["global_step"] = int64_t{11};
  const Config smaller2_cfg = tiny_config(dir + "/d", 384);
  Trainer smaller2(smaller2_cfg, Device::cpu(), make_model(smaller2_cfg));
  const Checkpoint before = deep_snapshot(smaller2);
  try {
    smaller2.restore(mid, LoadMode::Strict);
    FAIL("a mid-epoch checkpoint of another training-set size was accepted");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("epoch_sample_loss") != std::string::npos);
    CHECK(m.find("mid-epoch") != std::string::npos);
    CHECK(m.find("training set's size") != std::string::npos);
  }
  expect_same_state(before, smaller2.snapshot(), "after a refused restore");
}

TEST_CASE("Trainer::restore rolls back every component it touched, the failing one included") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_rollback");
  // fp16 (on the CPU: scaler enabled but inactive), so the scaler's state can differ too.
  Config cfg = tiny_config(dir + "/a");
  cfg.precision.mode = engine::Precision::Fp16;
  Trainer target(cfg, Device::cpu(), make_model(cfg));
  Config other_cfg = cfg;
  other_cfg.seed = 7;  // other weights, other RNG
  Trainer source(other_cfg, Device::cpu(), make_model(other_cfg));
  Checkpoint given = source.snapshot();
  // Make every group differ from the target's, so a half-applied load would show.
  given.groups.at("trainer").scalars["epoch"] = int64_t{1};
  given.groups.at("trainer").scalars["global_step"] = int64_t{8};
  given.groups.at("trainer").scalars["best_metric"] = 0.5;
  given.groups.at("scheduler").scalars["last_epoch"] = int64_t{1};
  given.groups.at("scaler").scalars["growth_tracker"] = int64_t{5};
  given.groups.at("scaler").scalars["scale"] = 1024.0;
  given.groups.at("metrics").scalars["epoch"] = std::vector<double>{1};
  for (const char* k : {"train_loss", "val_loss", "val_acc", "lr", "loss_scale", "epoch_seconds"})
    given.groups.at("metrics").scalars[k] = std::vector<double>{0.25};
  given.groups.at("optimizer").scalars["step/fc1.weight"] = int64_t{8};
  const Checkpoint before = deep_snapshot(target);

  for (const auto& [group, _] : before.groups) {
    CAPTURE(group);
    restore_faults::FailAfterGroup fail_after(group);
    CHECK_THROWS_WITH_AS(target.restore(given, LoadMode::Strict, &fail_after),
                         ("injected failure after loading " + group).c_str(), std::runtime_error);
    expect_same_state(before, target.snapshot(), "after a failure in " + group);
  }
  // A real failure halfway: the counters group names another early-stopping monitor.
  Checkpoint wrong_monitor = given;
  wrong_monitor.groups.at("trainer").scalars["monitor"] = std::string("val_acc");
  CHECK_THROWS_WITH(target.restore(wrong_monitor, LoadMode::Strict), doctest::Contains("monitors 'val_acc'"));
  expect_same_state(before, target.snapshot(), "after a monitor mismatch");
  // And the same checkpoint without a fault applies in full.
  target.restore(given, LoadMode::Strict);
  expect_same_state(given, target.snapshot(), "after a clean restore");
}
