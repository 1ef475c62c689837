// Run control in the library: per-run stop and checkpoint requests, stops during
// evaluation, the run directory's lock across processes, durations for --time-limit,
// restore's all-or-nothing rollback, the loss scaler's enabled rule and the
// epoch-boundary rule for the partial-epoch loss buffer.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "run_dir_util.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/train/run_control.h"
#include "engine/run/run_files.h"
#include "engine/run/run_lock.h"
#include "engine/nn/scaler.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "support/fake_clock.h"
#include "support/restore_faults.h"

using namespace engine;
using namespace test_util;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// A tiny CPU run: 512 training images in batches of 64 (8 steps per epoch), 2 epochs.
Config tiny_config(const std::string& run_dir, int64_t train_limit = 512) {
  return small_run_config("cpu", run_dir, train_limit);
}

// snapshot() aliases the live tensors: a copy that later changes cannot reach.
Checkpoint deep_snapshot(Trainer& t) {
  Checkpoint c = t.snapshot();
  for (auto& [name, g] : c.groups)
    for (auto& [k, tensor] : g.tensors) tensor = tensor.clone();
  return c;
}

// Every tensor and scalar of every group, bit for bit (the config text aside).
void expect_same_state(const Checkpoint& a, const Checkpoint& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.groups.size() == b.groups.size());
  for (const auto& [name, ga] : a.groups) {
    CAPTURE(name);
    const StateDict& gb = b.groups.at(name);
    CHECK(compare_state(ga, gb).clean());
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

// Asks its trainer to stop at a chosen moment.
class StopAt : public TrainerObserver {
 public:
  enum class When { EndOfEpochSteps, EndOfLastEpoch };
  StopAt(When when, int64_t epoch) : when_(when), epoch_(epoch) {}
  Trainer* trainer = nullptr;
  void on_progress(const Progress& p) override {
    // The last step of the epoch is done: the next thing fit() does is validation.
    if (when_ == When::EndOfEpochSteps && p.epoch == epoch_ && p.step == p.steps) trainer->control().request_stop();
  }
  void on_epoch_end(const EpochMetrics& m) override {
    // The last epoch is done: the next thing fit() does is the test evaluation.
    if (when_ == When::EndOfLastEpoch && m.epoch == epoch_) trainer->control().request_stop();
  }
  void on_message(const std::string& m) override { messages += m + "\n"; }
  std::string messages;

 private:
  When when_;
  int64_t epoch_;
};

}  // namespace

TEST_CASE("durations for --time-limit") {
  CHECK(parse_duration_seconds("5400") == 5400.0);
  CHECK(parse_duration_seconds("90s") == 90.0);
  CHECK(parse_duration_seconds("90m") == 5400.0);
  CHECK(parse_duration_seconds("1.5h") == 5400.0);
  CHECK(parse_duration_seconds("2d") == 172800.0);
  CHECK(parse_duration_seconds("01:30:00") == 5400.0);
  CHECK(parse_duration_seconds("90:00") == 5400.0);  // MM:SS
  CHECK(parse_duration_seconds("1-00:00:10") == 86410.0);
  for (const char* bad : {"", "0", "-5", "abc", "5x", "1:2:3:4", "1:60", "m", "1-", "::", "1e3"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_duration_seconds(bad).has_value());
  }
}

TEST_CASE("run directory lock: a second writer is refused at once, naming the holder; a dead holder never blocks") {
  const std::string dir = fresh_dir("run_lock");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  // The holder is killed when this test case ends, however it ends (ChildProcess).
  test_util::ChildProcess holder = test_util::ChildProcess::fork_running([&] {
    ::close(ready[0]);
    try {
      RunDirLock held = RunDirLock::acquire(dir);
      (void)!::write(ready[1], "1", 1);
      for (;;) ::pause();  // until SIGKILL
    } catch (...) {
      ::_exit(3);
    }
  });
  const pid_t child = holder.pid();
  REQUIRE(child > 0);
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);

  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const auto t0 = Clock::now();
  std::string message;
  try {
    RunDirLock second = RunDirLock::acquire(dir);
    FAIL("a second writer got the lock");
  } catch (const RunDirBusy& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(message);
  // At once: the holder never lets go, so a writer that waited for it would hang here
  // until the test's time limit. The bound only tells the two apart (no speed asked).
  CHECK(seconds < 60.0);
  CHECK(message.find("pid " + std::to_string(child)) != std::string::npos);
  CHECK(message.find(std::string("host ") + host) != std::string::npos);
  CHECK(message.find("since ") != std::string::npos);
  CHECK(message.find(dir) != std::string::npos);
  CHECK(message.find('\n') == std::string::npos);

  // SIGKILL: no destructor runs, the file still names the dead process, the lock is free.
  holder.kill_and_reap();
  const int status = holder.wait();
  REQUIRE(WIFSIGNALED(status));
  CHECK(read_lines(RunDirLock::lock_path(dir)).at(0).find("pid " + std::to_string(child)) == 0);
  {
    RunDirLock taken = RunDirLock::acquire(dir);
    const auto lines = read_lines(RunDirLock::lock_path(dir));
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("pid " + std::to_string(::getpid()) + " ") == 0);
    // Within one process too, one writer: a second lock is refused.
    try {
      RunDirLock again = RunDirLock::acquire(dir);
      FAIL("a second lock in the same process");
    } catch (const RunDirBusy& e) {
      CHECK(std::string(e.what()).find("(this process)") != std::string::npos);
    }
    RunDirLock moved = std::move(taken);  // moving keeps the lock
    CHECK_THROWS_AS(RunDirLock::acquire(dir), RunDirBusy);
  }
  // A clean release empties the file, so it never names a process that is not holding it.
  CHECK(fs::file_size(RunDirLock::lock_path(dir)) == 0);
  CHECK_NOTHROW(RunDirLock::acquire(dir));
}

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

TEST_CASE("a stop request belongs to its run: a second fit() in the same process trains on") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_two_fits");
  const Config first_cfg = tiny_config(dir + "/a");
  Trainer first(first_cfg, Device::cpu(), make_model(first_cfg));
  first.control().request_stop();  // before fit(): honoured by this run
  FitResult r = test_util::fit_in_run_dir(first);
  CHECK(r.ending == FitResult::Ending::Stopped);
  CHECK(r.stop_cause == FitResult::StopCause::Requested);
  CHECK(first.global_step() == 1);
  CHECK_FALSE(first.control().stop_requested());  // consumed by the run it stopped
  // The same trainer goes on, and another trainer in this process trains in full.
  StopPlan one_epoch;
  one_epoch.after_epochs = 1;
  r = test_util::fit_in_run_dir(first, one_epoch);
  CHECK(r.stop_cause == FitResult::StopCause::EpochLimit);
  CHECK(first.global_step() == 8);
  const Config second_cfg = tiny_config(dir + "/b");
  Trainer second(second_cfg, Device::cpu(), make_model(second_cfg));
  r = test_util::fit_in_run_dir(second);
  CHECK(r.ending == FitResult::Ending::Completed);
  CHECK(second.global_step() == 16);
  REQUIRE(r.test.has_value());
  // A RunDirectory takes the run directory's lock: a writer holding it in this process blocks it.
  RunDirLock held = RunDirLock::acquire(dir + "/a");
  CHECK_THROWS_AS(test_util::fit_in_run_dir(first), RunDirBusy);
}

TEST_CASE("Ctrl-C during validation or the test evaluation stops there; the run resumes bit-exactly") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_eval_stop");
  const Config reference_cfg = tiny_config(dir + "/ref");
  Trainer reference(reference_cfg, Device::cpu(), make_model(reference_cfg));
  const FitResult ref = test_util::fit_in_run_dir(reference);
  REQUIRE(ref.test.has_value());

  for (auto when : {StopAt::When::EndOfEpochSteps, StopAt::When::EndOfLastEpoch}) {
    const bool in_validation = when == StopAt::When::EndOfEpochSteps;
    CAPTURE(in_validation);
    const std::string run = dir + (in_validation ? "/val" : "/test");
    StopAt observer(when, in_validation ? 1 : 2);
    {
      const Config t_cfg = tiny_config(run);
      TrainerOptions options;
      options.observer = &observer;
      Trainer t(t_cfg, Device::cpu(), make_model(t_cfg), std::move(options));
      observer.trainer = &t;
      const FitResult r = test_util::fit_in_run_dir(t);
      INFO(observer.messages);
      CHECK(r.ending == FitResult::Ending::Stopped);
      CHECK(r.stop_cause == FitResult::StopCause::Requested);
      CHECK_FALSE(r.test.has_value());
      CHECK(observer.messages.find(in_validation ? "stopped during the validation of epoch 1"
                                                 : "stopped during the test evaluation") != std::string::npos);
      CHECK(t.history().size() == (in_validation ? 0u : 2u));
    }
    verify_checkpoint_file(run + "/last.h5");
    const Checkpoint saved = load_checkpoint(run + "/last.h5");
    CHECK(saved.groups.at("trainer").get_int("step_in_epoch") == (in_validation ? 8 : 0));
    const Config resumed_cfg = tiny_config(run);
    Trainer resumed(resumed_cfg, Device::cpu(), make_model(resumed_cfg));
    resumed.resume_from(run + "/last.h5", LoadMode::Strict);
    const FitResult r = test_util::fit_in_run_dir(resumed);
    CHECK(r.ending == FitResult::Ending::Completed);
    REQUIRE(r.test.has_value());
    CHECK(r.test->loss == ref.test->loss);
    CHECK(r.test->accuracy == ref.test->accuracy);
    expect_same_state(reference.snapshot(), resumed.snapshot(), "resumed vs uninterrupted");
  }
}

TEST_CASE("fit() without a run directory writes no file; a RunDirectory estimates its first save from the state's size") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("run_control_no_sink") + "/run";
  const Config cfg = tiny_config(dir);
  Trainer t(cfg, Device::cpu(), make_model(cfg));
  StopPlan one_epoch;
  one_epoch.after_epochs = 1;
  CHECK(t.fit(one_epoch).stop_cause == FitResult::StopCause::EpochLimit);
  CHECK(t.epochs_done() == 1);
  CHECK_FALSE(fs::exists(dir));  // no lock, no checkpoint, no metrics.jsonl: a rank other than 0
  // --time-limit before anything was saved: the CNN's ~5 MB state is estimated at a
  // fraction of a second (it once assumed 1 s per save, which stopped short runs early).
  RunDirectory run(t);
  const double first = run.save_estimate(t);
  CHECK(first > 0.1);
  CHECK(first < 0.5);
  run.save(t, CheckpointKind::Last);
  run.flush(t);
  REQUIRE(run.saves().size() == 1);
  CHECK(run.saves()[0].total_seconds > 0);
  CHECK(run.save_estimate(t) >= 1.25 * run.saves()[0].total_seconds * 0.5);  // now from the saves measured
  CHECK(fs::exists(dir + "/last.h5"));
}

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

TEST_CASE("run_files: the names a run leaves, --fresh moving them aside, a completed run's metrics") {
  using namespace engine;
  CHECK(run_files::milestone(5) == "epoch_0005.h5");
  CHECK(run_files::milestone(12345) == "epoch_12345.h5");
  for (const char* n : {"last.h5", "best.h5", "metrics.jsonl", "tensorboard", "report.html", "epoch_0003.h5",
                        ".last.h5.tmp.1234", ".metrics.jsonl.tmp.77"})
    CHECK_MESSAGE(run_files::is_run_file(n), n);
  for (const char* n : {".lock", "notes.txt", "last.h5.bak", "epoch_3.txt", "."})
    CHECK_MESSAGE(!run_files::is_run_file(n), n);

  const std::string dir = fresh_dir("run_files_fresh");
  namespace fs = std::filesystem;
  for (const fs::path& p : fs::directory_iterator(fs::path(dir).parent_path()))
    if (p.filename().string().rfind(fs::path(dir).filename().string() + ".replaced-", 0) == 0) fs::remove_all(p);
  CHECK(move_previous_run_aside(dir).files == 0);  // nothing to move: nothing created
  for (const char* n : {"last.h5", "epoch_0001.h5", "metrics.jsonl", "notes.txt", ".lock"})
    std::ofstream(dir + "/" + n) << "x";
  CHECK_FALSE(test_result_recorded(dir));
  std::ofstream(dir + "/metrics.jsonl") << "{\"epoch\":1}\n{\"test_acc\":0.5,\"test_loss\":1.0}\n";
  CHECK(test_result_recorded(dir));
  const MovedAside moved = move_previous_run_aside(dir);
  CHECK(moved.files == 3);
  CHECK(fs::exists(moved.dir + "/last.h5"));
  CHECK(fs::exists(moved.dir + "/epoch_0001.h5"));
  CHECK(fs::exists(moved.dir + "/metrics.jsonl"));
  CHECK(fs::exists(dir + "/notes.txt"));  // not a run's file: stays
  CHECK(fs::exists(dir + "/.lock"));
  CHECK_FALSE(fs::exists(dir + "/last.h5"));
  CHECK_FALSE(test_result_recorded(dir));
  // A second move in the same second gets its own directory.
  std::ofstream(dir + "/best.h5") << "x";
  const MovedAside again = move_previous_run_aside(dir);
  CHECK(again.files == 1);
  CHECK(again.dir != moved.dir);
  CHECK_THROWS_AS(move_previous_run_aside(dir + "/missing"), std::runtime_error);
  fs::remove_all(moved.dir);
  fs::remove_all(again.dir);
}
