// Training on the GPU: determinism, bit-exact resume, GPU<->CPU checkpoint remapping,
// and the fp16 loss scaler. Exits 77 (skipped) where no GPU is present.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "cli_util.h"
#include "gpu/device_test_util.h"  // skips (exit 77) without a GPU
#include "run_dir_util.h"
#include "engine/train/config.h"
#include "engine/core/device.h"
#include "engine/train/process_settings.h"
#include "engine/nn/scaler.h"
#include "engine/io/checkpoint.h"

using namespace test_util;

namespace {

std::string gpu_run(const std::string& dir, const std::string& extra = "") {
  return small_run(dir, "cuda") + extra;
}

void expect_identical(const std::string& a, const std::string& b) {
  const RunResult d = run("diff \"" + a + "\" \"" + b + "\"");
  INFO(d.output);
  CHECK(d.exit_code == 0);
}

}  // namespace

TEST_CASE("GPU: same seed, deterministic cuDNN => bit-identical checkpoints") {
  const std::string a = fresh_dir("gpu_same_a"), b = fresh_dir("gpu_same_b");
  RunResult r = run(gpu_run(a));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(run(gpu_run(b)).exit_code == 0);
  expect_identical(a + "/last.h5", b + "/last.h5");
  const engine::Checkpoint ck = engine::load_checkpoint(a + "/last.h5");
  CHECK(ck.meta.saved_on == "cuda:0");
}

TEST_CASE("GPU: stop after 2 epochs and mid-epoch SIGKILL resume bit-exactly") {
  const std::string ref = fresh_dir("gpu_resume_ref"), b = fresh_dir("gpu_resume_b");
  const std::string extra = " --set checkpoint.every_n_steps=5";
  REQUIRE(run(gpu_run(ref, extra)).exit_code == 0);
  REQUIRE(run(gpu_run(b, extra) + " --stop-after-epochs 2").exit_code == 0);
  RunResult r = run_killed_after_step(43, gpu_run(b, extra));
  CHECK(r.signal == 9);
  r = run(gpu_run(b, extra));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 2, step 8") != std::string::npos);
  expect_identical(ref + "/last.h5", b + "/last.h5");
}

TEST_CASE("GPU -> CPU -> GPU: a checkpoint moves between devices and keeps all state") {
  const std::string g = fresh_dir("gpu_remap_g"), c = fresh_dir("gpu_remap_c"), g2 = fresh_dir("gpu_remap_g2");
  // fp16 on the GPU so the loss scaler has live state to carry through the CPU.
  const std::string fp16 = " --set precision.mode=fp16";
  REQUIRE(run(gpu_run(g, fp16) + " --stop-after-epochs 1").exit_code == 0);
  RunResult r = run("eval " + g + "/last.h5 --device cpu --limit 256");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("saved on cuda:0") != std::string::npos);
  r = run("resume " + g + "/last.h5 --device cpu --run-dir " + c + " --stop-after-epochs 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const engine::Checkpoint on_gpu = engine::load_checkpoint(g + "/last.h5");
  const engine::Checkpoint on_cpu = engine::load_checkpoint(c + "/last.h5");
  CHECK(on_cpu.meta.saved_on == "cpu");
  // The CPU trains fp32 and leaves the scaler's state exactly as the GPU left it.
  CHECK(on_cpu.groups.at("scaler").get_real("scale") == on_gpu.groups.at("scaler").get_real("scale"));
  CHECK(on_cpu.groups.at("scaler").get_int("growth_tracker") ==
        on_gpu.groups.at("scaler").get_int("growth_tracker"));
  CHECK(on_cpu.groups.at("trainer").get_int("epoch") == 2);
  r = run("resume " + c + "/last.h5 --device cuda --run-dir " + g2);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const engine::Checkpoint back = engine::load_checkpoint(g2 + "/last.h5");
  CHECK(back.meta.saved_on == "cuda:0");
  CHECK(back.groups.at("trainer").get_int("epoch") == 4);
  CHECK(back.groups.at("scaler").get_int("growth_tracker") >
        on_cpu.groups.at("scaler").get_int("growth_tracker"));
}

TEST_CASE("GPU: the loss scaler skips the step and backs off on an inf gradient") {
  using namespace engine;
  Parameter p{"w", Tensor::from_vector({3}, {1.0f, 2.0f, 3.0f}, Device::cuda()),
              Tensor::from_vector({3}, {8.0f, std::numeric_limits<float>::infinity(), 1.0f}, Device::cuda())};
  LossScaler s(true, 8.0, 2.0, 0.5, 2000);
  s.set_active(true);
  const bool found = s.unscale({&p});
  CHECK(found);
  s.update(found);
  CHECK(s.scale() == 4.0);
  CHECK(s.growth_tracker() == 0);
  Parameter q{"w", Tensor::from_vector({2}, {1.0f, 2.0f}, Device::cuda()),
              Tensor::from_vector({2}, {8.0f, 16.0f}, Device::cuda())};
  CHECK_FALSE(s.unscale({&q}));
  CHECK(q.grad.to_vector() == std::vector<float>{2.0f, 4.0f});
}

TEST_CASE("GPU: checkpoint.async copies the state on the compute stream; every save holds the state of its request") {
  // The writer waits for the device-to-pinned copies (a CUDA event) while the training
  // thread queues the next steps behind them: each save must equal the one a run that
  // saves on the training thread (checkpoint.async off) wrote at the same moment.
  std::vector<std::vector<std::string>> kept;
  for (const bool async : {true, false}) {
    CAPTURE(async);
    const std::string dir = fresh_dir(async ? "gpu_async" : "gpu_sync");
    engine::Config cfg = small_run_config("cuda", dir + "/run", 1024, 2);
    cfg.checkpoint.every_n_steps = 3;
    cfg.checkpoint.async = async;
    engine::apply_process_settings(cfg);  // deterministic cuDNN, as `engine train` sets it
    kept.push_back(keep_every_checkpoint(cfg, engine::Device::cuda(0), dir + "/kept"));
  }
  REQUIRE(kept[0].size() == kept[1].size());
  CHECK(kept[0].size() >= 10);
  for (std::size_t i = 0; i < kept[0].size(); ++i) expect_identical(kept[0][i], kept[1][i]);
}
