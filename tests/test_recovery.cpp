// Recovery on start (docs/recovery.md): a run resumes from the newest sound checkpoint of
// any tier, says which file it used and which it skipped and why, repairs the copies that
// are damaged, stale or missing, and never resumes another run's checkpoint. Through the
// CLI on a small Fashion-MNIST run, each ending `engine diff`-identical to an
// uninterrupted run; and through the library on the synthetic data set:
// checkpoint.every_seconds under slow steps (a clock the test moves), checkpoint.keep_best,
// RunSession::begin. The replicas' own cases (checkpoint.replicas) are in test_replicas.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/run/recovery.h"
#include "engine/run/run_directory.h"
#include "engine/run/run_files.h"
#include "engine/run/run_session.h"
#include "engine/train/trainer.h"
#include "recovery_runs.h"
#include "run_compare.h"
#include "synthetic_data.h"

using namespace test_util;
using namespace engine;
namespace fs = std::filesystem;

namespace {

// 64 bytes of the middle of `path` overwritten (what the issue did to last.h5).
void damage_middle(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
  for (int i = 0; i < 64; ++i) f.put(static_cast<char>(0xA5 ^ i));
}

}  // namespace

TEST_CASE("a damaged last.h5: the run resumes from the newest sound copy, repairs last.h5 and ends identical") {
  if (!dataset_available()) return;
  const std::string dir = copy_of_three_epochs("recovery_damaged_last");
  damage_middle(dir + "/last.h5");
  // The user asked for that very file: refused, naming the sound ones beside it.
  expect_one_line_error(run("resume " + dir + "/last.h5"),
                        {dir + "/last.h5", "checksum mismatch", "sound checkpoints beside it", dir + "/best.h5",
                         dir + "/epoch_0002.h5", "global step 48"});
  const RunResult r = run(small_run(dir));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "resuming from epoch 3, step 0 of epoch 4 (" + dir + "/best.h5); skipped " + dir +
                               "/last.h5: checksum mismatch (file is corrupt)"));
  CHECK(contains(r.output, "repaired " + dir + "/last.h5 (damaged: checksum mismatch"));
  CHECK_FALSE(contains(r.output, "--fresh"));
  expect_same_run(reference_run(), dir);
}

TEST_CASE("a damaged last.h5 and a zero-length best.h5: resumed from the milestone, ends identical") {
  if (!dataset_available()) return;
  const std::string dir = copy_of_three_epochs("recovery_zero_best");
  damage_middle(dir + "/last.h5");
  fs::resize_file(dir + "/best.h5", 0);
  const RunResult r = run(small_run(dir));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "resuming from epoch 2, step 0 of epoch 3 (" + dir + "/epoch_0002.h5); skipped "));
  CHECK(contains(r.output, dir + "/best.h5: truncated"));
  CHECK_FALSE(contains(r.output, "--fresh"));
  expect_same_run(reference_run(), dir);
}

TEST_CASE("no sound checkpoint at all: one line naming every file tried, nothing trained") {
  if (!dataset_available()) return;
  const std::string dir = copy_of_three_epochs("recovery_none_sound");
  damage_middle(dir + "/last.h5");
  fs::resize_file(dir + "/best.h5", 0);
  fs::resize_file(dir + "/epoch_0002.h5", fs::file_size(dir + "/epoch_0002.h5") / 3);  // a truncated milestone
  const auto before = fs::last_write_time(dir + "/last.h5");
  expect_one_line_error(run(small_run(dir)), {"no sound checkpoint of this run", dir + "/last.h5 (checksum mismatch",
                                              dir + "/epoch_0002.h5 (truncated", dir + "/best.h5 (truncated"});
  CHECK(fs::last_write_time(dir + "/last.h5") == before);  // nothing overwritten
  expect_one_line_error(run("resume " + dir), {dir, "no sound checkpoint"});
}

TEST_CASE("engine resume RUN_DIR resumes from the newest sound checkpoint in it") {
  if (!dataset_available()) return;
  const std::string dir = copy_of_three_epochs("recovery_resume_dir");
  damage_middle(dir + "/last.h5");
  const RunResult r = run("resume " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "(" + dir + "/best.h5); skipped " + dir + "/last.h5"));
  expect_same_run(reference_run(), dir);
}

TEST_CASE("another run's checkpoints: never resumed; refused in the run directory, replaced in a replica") {
  if (!dataset_available()) return;
  // In the run directory: refused, nothing overwritten.
  const std::string dir = copy_of_three_epochs("recovery_other_run");
  expect_one_line_error(run(small_run(dir) + " --set seed=1"),
                        {dir + "/last.h5", "another run's checkpoint", "seed 0 there, 1 here"});
  expect_one_line_error(run(small_run(dir) + " --set optimizer.lr=0.002"),
                        {"another run's checkpoint", "optimizer.lr 0.001 there, 0.002 here"});
  CHECK(global_step_of(dir + "/last.h5") == 48);
  // In a replica (seed 0's files, this run has seed 1): not resumed, started fresh, replaced.
  const std::string replica = copy_of_three_epochs("recovery_other_run_replica");
  const std::string fresh = fresh_dir("recovery_other_run_fresh");
  const RunResult r = run(small_run(fresh) + " --set seed=1 --stop-after-epochs 1" + replicas_flag(replica));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "warning: " + replica + "/last.h5: another run's checkpoint (seed 0 there, 1 here); not resumed"));
  CHECK_FALSE(contains(r.output, "resuming"));
  CHECK(global_step_of(replica + "/last.h5") == 16);
  CHECK(run("diff " + fresh + "/last.h5 " + replica + "/last.h5").exit_code == 0);
}

// ---- the library, on the synthetic data set -------------------------------------------

namespace {

// The real file calls, and a monotonic clock that moves only when the test says.
class SteppedClock final : public EnvWrapper {
 public:
  SteppedClock() : EnvWrapper(Env::posix()) {}
  void advance(std::chrono::seconds s) { now_ += std::chrono::duration_cast<std::chrono::nanoseconds>(s).count(); }
  std::chrono::steady_clock::time_point monotonic_now() override {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::nanoseconds(now_.load())));
  }

 private:
  std::atomic<int64_t> now_{0};
};

}  // namespace

TEST_CASE("checkpoint.every_seconds: last.h5 at the first step boundary that long after the last save, resumed identical") {
  const std::string base = fresh_dir("recovery_every_seconds");
  // Each step takes 10 s on the test's clock; a save by time every 25 s.
  Config c = synthetic(base + "/timed", 2);
  c.checkpoint.every_seconds = 25;
  SteppedClock clock;
  struct SlowSteps : TrainerObserver {
    SteppedClock& clock;
    std::string dir, kept;
    int64_t keep_at;
    explicit SlowSteps(SteppedClock& c, std::string d, int64_t at) : clock(c), dir(std::move(d)), keep_at(at) {}
    void on_step_end(int64_t) override { clock.advance(std::chrono::seconds(10)); }
    void on_checkpoint(const std::string& path, CheckpointKind kind) override {
      if (kind == CheckpointKind::MidEpoch && kept.empty() && global_step_of(path) == keep_at) {
        kept = dir + "/kept.h5";
        fs::copy_file(path, kept);
      }
    }
  } slow(clock, base, 10);
  std::vector<SaveRecord> saves;
  {
    auto t = synthetic_trainer(c, &slow, &clock);
    RunDirectory run(*t);
    REQUIRE(run.fit().ending == FitResult::Ending::Completed);
    saves = run.saves();
  }
  // 6 steps per epoch; the clock moves at the end of each step, after its save decision, so
  // step k decides at 10 (k - 1) s: a save by time at step 4 (30 s after the start) and at
  // step 10 (30 s after epoch 1's last.h5, written at 60 s), besides the epochs' own.
  std::vector<int64_t> mid;
  for (const SaveRecord& s : saves)
    if (s.file == "last.h5" && s.global_step % 6 != 0) mid.push_back(s.global_step);
  CHECK(mid == std::vector<int64_t>{4, 10});
  REQUIRE_FALSE(slow.kept.empty());
  // The save by time resumes to the same bits as a run that never stopped.
  Config plain = synthetic(base + "/plain", 2);
  {
    auto t = synthetic_trainer(plain);
    RunDirectory run(*t);
    REQUIRE(run.fit().ending == FitResult::Ending::Completed);
  }
  Config resumed = synthetic(base + "/resumed", 2);
  {
    auto t = synthetic_trainer(resumed);
    t->resume_from(slow.kept, LoadMode::Strict);
    CHECK(t->global_step() == 10);
    RunDirectory run(*t);
    REQUIRE(run.fit().ending == FitResult::Ending::Completed);
  }
  const CheckpointDiff d = diff_checkpoints(base + "/plain/last.h5", base + "/resumed/last.h5");
  INFO(d.report);
  CHECK(d.identical);
}

TEST_CASE("checkpoint.keep_best: the k best epochs kept by name, milestones rotated around them, best.h5 the best") {
  const std::string dir = fresh_dir("recovery_keep_best");
  Config c = synthetic(dir, 6);
  c.checkpoint.keep_best = 2;
  c.checkpoint.every_n_epochs = 1;
  c.checkpoint.keep_last = 1;
  c.train.early_stopping.monitor = MonitorMetric::ValAcc;
  std::vector<EpochMetrics> history;
  {
    auto t = synthetic_trainer(c);
    RunDirectory run(*t);
    REQUIRE(run.fit().ending == FitResult::Ending::Completed);
    history = t->history();
  }
  const std::vector<int64_t> best = best_epochs(history, MonitorMetric::ValAcc, 2);
  REQUIRE(best.size() == 2);
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("best_epoch_", 0) == 0) kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  std::vector<std::string> expected{run_files::best_of_epoch(std::min(best[0], best[1])),
                                    run_files::best_of_epoch(std::max(best[0], best[1]))};
  CHECK(kept == expected);
  CHECK(fs::exists(dir + "/" + run_files::milestone(6)));
  CHECK_FALSE(fs::exists(dir + "/" + run_files::milestone(5)));  // keep_last = 1
  // best.h5 is the best epoch's state.
  CHECK(diff_checkpoints(dir + "/best.h5", dir + "/" + run_files::best_of_epoch(best[0])).identical);
  // They are full states the survey reads.
  const RunSurvey s = survey_run(c);
  CHECK(std::count_if(s.copies.begin(), s.copies.end(), [](const CheckpointCopy& x) {
          return x.file.rfind("best_epoch_", 0) == 0 && x.verdict == CopyVerdict::Sound;
        }) == 2);
}

TEST_CASE("RunSession::begin: what an embedder gets, the same as engine train") {
  const std::string dir = fresh_dir("recovery_session");
  Config c = synthetic(dir, 3);
  c.checkpoint.every_n_epochs = 1;
  {
    RunSession session(c);
    session.start(synthetic_model(c), nullptr, std::make_unique<SyntheticDataset>());
    const RunBegin b = session.begin();
    CHECK(b.outcome == RunBegin::Outcome::Fresh);
    CHECK(b.messages.empty());
    REQUIRE(session.fit({2}).ending == FitResult::Ending::Stopped);
  }
  damage_middle(dir + "/last.h5");
  {
    RunSession session(c);
    session.start(synthetic_model(c), nullptr, std::make_unique<SyntheticDataset>());
    const RunBegin b = session.begin();
    CHECK(b.outcome == RunBegin::Outcome::Resumed);
    CHECK(b.checkpoint == dir + "/epoch_0002.h5");
    REQUIRE(b.survey.chosen_copy() != nullptr);
    CHECK(b.survey.chosen_copy()->global_step == 12);
    REQUIRE(b.messages.size() >= 2);
    CHECK(contains(b.messages[0], "skipped " + dir + "/last.h5: checksum mismatch"));
    CHECK(contains(b.messages[1], "repaired " + dir + "/last.h5"));
    CHECK(session.fit().ending == FitResult::Ending::Completed);
  }
  {
    RunSession session(c);
    session.start(synthetic_model(c), nullptr, std::make_unique<SyntheticDataset>());
    CHECK(session.begin().outcome == RunBegin::Outcome::AlreadyComplete);
  }
  {
    RunSession session(c);
    session.start(synthetic_model(c), nullptr, std::make_unique<SyntheticDataset>());
    const RunBegin b = session.begin({StartFrom::Scratch});
    CHECK(b.outcome == RunBegin::Outcome::Fresh);
    REQUIRE(b.messages.size() == 1);
    CHECK(contains(b.messages[0], "--fresh: moved the previous run's"));
    CHECK_FALSE(fs::exists(dir + "/last.h5"));
  }
  for (const auto& e : fs::directory_iterator(fs::path(dir).parent_path()))
    if (e.path().filename().string().rfind(fs::path(dir).filename().string() + ".replaced-", 0) == 0)
      fs::remove_all(e.path());
}
