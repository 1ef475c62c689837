// Stopping a run from outside (engine/train/run_control.h): durations for --time-limit, a
// stop request that belongs to its own run, and Ctrl-C during validation or the test
// evaluation, resumed bit-exactly.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "engine/io/checkpoint.h"
#include "engine/run/run_lock.h"
#include "engine/train/model_factory.h"
#include "engine/train/run_control.h"
#include "engine/train/trainer.h"
#include "run_dir_util.h"
#include "tiny_run.h"

using namespace engine;
using namespace test_util;

namespace {

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
