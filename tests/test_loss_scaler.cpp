// The loss scaler (engine/nn/scaler.h) and precision.mode: the config decides whether the
// scaler is enabled, a saved scale continues when there is one, and bf16 runs without one.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/io/checkpoint.h"
#include "engine/nn/scaler.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "tiny_run.h"

using namespace engine;
using namespace test_util;

TEST_CASE("the loss scaler: the config decides enabled, the saved scale continues when there is one") {
  LossScaler fp32(false, 65536.0, 2.0, 0.5, 2000);
  LossScaler fp16(true, 65536.0, 2.0, 0.5, 2000);
  fp16.set_active(true);
  fp16.update(false);  // tracker 1
  fp16.update(true);   // overflow: scale halves, tracker 0
  fp16.update(false);
  fp16.update(false);  // tracker 2
  REQUIRE(fp16.scale() == 32768.0);
  REQUIRE(fp16.growth_tracker() == 2);

  SUBCASE("an fp32 checkpoint resumed in fp16 scales, from the configured initial scale") {
    LossScaler resumed(true, 1024.0, 2.0, 0.5, 2000);
    resumed.load_state(fp32.state());
    CHECK(resumed.enabled());
    CHECK(resumed.scale() == 1024.0);
    CHECK(resumed.growth_tracker() == 0);
    resumed.set_active(true);  // on CUDA
    CHECK(resumed.active());
    CHECK(resumed.loss_scale() == 1024.0f);
  }
  SUBCASE("an fp16 checkpoint resumed in fp16 continues its scale and tracker") {
    LossScaler resumed(true, 1024.0, 2.0, 0.5, 2000);
    resumed.load_state(fp16.state());
    CHECK(resumed.enabled());
    CHECK(resumed.scale() == 32768.0);
    CHECK(resumed.growth_tracker() == 2);
  }
  SUBCASE("an fp16 checkpoint resumed in fp32 does not scale") {
    LossScaler resumed(false, 65536.0, 2.0, 0.5, 2000);
    resumed.load_state(fp16.state());
    resumed.set_active(true);
    CHECK_FALSE(resumed.enabled());
    CHECK_FALSE(resumed.active());
    CHECK(resumed.scale() == 1.0);
    CHECK(resumed.loss_scale() == 1.0f);
  }
}

TEST_CASE("precision.mode bf16: no loss scaler, fp32 on the CPU, and the checkpoint records bf16") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_bf16");
  Config fp16_cfg = tiny_config(dir + "/a");
  fp16_cfg.precision.mode = engine::Precision::Fp16;
  Trainer fp16(fp16_cfg, Device::cpu(), make_model(fp16_cfg));
  Config bf16_cfg = tiny_config(dir + "/b");
  bf16_cfg.precision.mode = engine::Precision::Bf16;
  Trainer bf16(bf16_cfg, Device::cpu(), make_model(bf16_cfg));
  CHECK(bf16.compute_precision() == engine::Precision::Fp32);  // the CPU backend is fp32
  CHECK(engine::compute_precision(engine::Precision::Bf16, Device::cuda(0)) == engine::Precision::Bf16);
  CHECK(engine::compute_precision(engine::Precision::Fp16, Device::cuda(0)) == engine::Precision::Fp16);
  CHECK(engine::compute_precision(engine::Precision::Fp32, Device::cuda(0)) == engine::Precision::Fp32);
  CHECK(!engine::scales_loss(engine::Precision::Bf16));
  CHECK(engine::scales_loss(engine::Precision::Fp16));

  // Disabled as in fp32: scale 1, even after resuming an fp16 run's scaler.
  const Checkpoint mine = bf16.snapshot();
  CHECK(mine.groups.at("scaler").get_int("enabled") == 0);
  CHECK(mine.groups.at("scaler").get_real("scale") == 1.0);
  CHECK(nlohmann::json::parse(mine.config_json)["precision"]["mode"] == "bf16");
  CHECK(bf16.restore(fp16.snapshot(), LoadMode::Strict).clean());
  CHECK(bf16.snapshot().groups.at("scaler").get_real("scale") == 1.0);

  // Through a file: the stored config says bf16, and an fp32 run resumes it (the
  // checkpoint's layout is the same in every mode).
  save_checkpoint(dir + "/bf16.h5", mine);
  const Checkpoint loaded = load_checkpoint(dir + "/bf16.h5");
  CHECK(engine::config_from_json(nlohmann::json::parse(loaded.config_json), "x").precision.mode ==
        engine::Precision::Bf16);
  const Config fp32_cfg = tiny_config(dir + "/c");
  Trainer fp32(fp32_cfg, Device::cpu(), make_model(fp32_cfg));
  CHECK(fp32.restore(loaded, LoadMode::Strict).clean());
}
