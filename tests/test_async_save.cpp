// checkpoint.async: a save handed to the writer thread holds the state of the step that
// requested it, as a save on the training thread does, while training goes on.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "engine/io/env.h"
#include "engine/run/run_directory.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "run_dir_util.h"
#include "support/fake_clock.h"
#include "tiny_run.h"

using namespace engine;
using namespace test_util;
namespace fs = std::filesystem;

namespace {

// Holds every file creation, once armed, until the test releases it: the writer thread
// of an async save waits there, before writing a byte, while the training thread trains on.
class GateEnv final : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  int create(const std::string& path, mode_t mode) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (armed_) {
        ++held_;
        changed_.notify_all();
        changed_.wait(lock, [this] { return !armed_; });
      }
    }
    return EnvWrapper::create(path, mode);
  }
  void arm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
  }
  // True once a creation is held (false after 60 s: the writer never came).
  bool wait_until_held() {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [this] { return held_ > 0; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool armed_ = false;
  int held_ = 0;
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("checkpoint.async: every save holds the state of the moment it was requested, as a save on the training thread") {
  if (!dataset_available()) return;
  std::vector<std::vector<std::string>> kept;
  for (const bool async : {true, false}) {
    CAPTURE(async);
    const std::string dir = fresh_dir(async ? "run_control_async" : "run_control_sync");
    Config cfg = tiny_config(dir + "/run");
    cfg.checkpoint.async = async;
    cfg.checkpoint.every_n_steps = 3;  // mid-epoch saves while the next steps train
    kept.push_back(keep_every_checkpoint(cfg, Device::cpu(), dir + "/kept"));
  }
  REQUIRE(kept[0].size() == kept[1].size());
  CHECK(kept[0].size() >= 6);  // two epochs: mid-epoch saves, last.h5 and best.h5 at each end
  for (std::size_t i = 0; i < kept[0].size(); ++i) {
    CHECK(fs::path(kept[0][i]).filename() == fs::path(kept[1][i]).filename());
    const CheckpointDiff d = diff_checkpoints(kept[0][i], kept[1][i]);
    INFO(d.report);
    CHECK(d.identical);
  }
}

// The snapshot itself, without timing and without checkpoint.verify's reload (which
// would otherwise be what catches a snapshot missing a group): at step 5 the trainer's
// state is written on the training thread (Trainer::save_checkpoint, no snapshot buffer),
// then through the run directory; with checkpoint.async the writer is held before its
// first byte while three more steps change every parameter and moment. Both files must
// be byte for byte the same (the clocks are fixed, so the timestamps are too).
TEST_CASE("checkpoint.async: a save written while training goes on is byte for byte the state of its request") {
  if (!dataset_available()) return;
  for (const bool async : {true, false}) {
    CAPTURE(async);
    const std::string dir = fresh_dir(async ? "run_control_gate_async" : "run_control_gate_sync");
    fake_clock::FakeClockEnv clock;
    clock.set_wall(std::chrono::system_clock::time_point(std::chrono::seconds(1796000000)));
    clock.set_monotonic_step(std::chrono::nanoseconds(0));  // durations (epoch_elapsed_seconds) all 0
    GateEnv gate(clock);
    Config cfg = tiny_config(dir + "/run");
    cfg.checkpoint.async = async;
    cfg.checkpoint.verify = false;
    TrainerOptions options;
    options.env = &gate;
    Trainer t(cfg, Device::cpu(), make_model(cfg), std::move(options));
    RunDirectory run(t);
    for (int i = 0; i < 5; ++i) t.train_step();
    t.save_checkpoint(dir + "/reference.h5");
    const std::vector<float> weight_at_request = t.model().parameters()[0]->value.to_vector();
    if (async) {
      gate.arm();
      run.save(t, CheckpointKind::MidEpoch);
      REQUIRE(gate.wait_until_held());
      for (int i = 0; i < 3; ++i) t.train_step();
      CHECK(t.model().parameters()[0]->value.to_vector() != weight_at_request);  // the state moved on
      gate.release();
    } else {
      run.save(t, CheckpointKind::MidEpoch);
    }
    run.flush(t);
    const std::string reference = file_bytes(dir + "/reference.h5");
    const std::string saved = file_bytes(dir + "/run/last.h5");
    REQUIRE(reference.size() > 100000);
    CHECK(saved.size() == reference.size());
    CHECK(saved == reference);
    if (saved != reference) {
      const CheckpointDiff d = diff_checkpoints(dir + "/reference.h5", dir + "/run/last.h5");
      INFO(d.report);
      CHECK(d.identical);
    }
  }
}
