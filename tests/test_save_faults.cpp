// Every write failure is survivable: a save that fails at any step (create, write,
// fsync, close, rename, directory fsync) with any of the errors a full or failing disk
// gives leaves the previous file loadable and bit-identical, no temporary or hidden file,
// and one line naming the file and the reason; training stops or goes on as
// checkpoint.on_error says, and resumes bit-exactly once the disk is fixed.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "run_dir_util.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/train/config.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "io/atomic_file.h"
#include "io/deferred_remove.h"
#include "support/file_faults.h"

using namespace engine;
namespace fs = std::filesystem;
using file_faults::Step;

namespace {

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

// A complete checkpoint whose one tensor is filled with `value`.
Checkpoint state(float value) {
  Checkpoint c;
  c.meta.saved_on = "cpu";
  c.config_json = "{}";
  for (const std::string& g : checkpoint_required_groups()) c.groups[g];
  std::vector<float> v(4096, value);
  c.groups["model"].tensors["w"] = Tensor::from_vector({64, 64}, v);
  c.groups["trainer"].scalars["epoch"] = int64_t{3};
  return c;
}

// Names in `dir` that start with '.': temporary files and hidden replaced versions.
// Hidden files a save may leave behind (temporary files, replaced versions). The run
// directory's lock file (.lock, run_lock.h) is there by design and is not one of them.
std::vector<std::string> hidden_in(const std::string& dir) {
  finish_pending_removals();
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name[0] == '.' && name != ".lock") found.push_back(name);
  }
  return found;
}

std::string error_of(const std::function<void()>& f, bool* write_error = nullptr) {
  try {
    f();
  } catch (const CheckpointWriteError& e) {
    if (write_error) *write_error = true;
    return e.what();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "NO ERROR";
}

struct Case {
  Step step;
  int skip;  // the fault hits the skip+1-th call of the step
};

}  // namespace

TEST_CASE("a save failing at any step with any disk error keeps the previous file and leaves nothing behind") {
  const std::string dir = test_util::fresh_dir("save_faults");
  const std::string path = dir + "/last.h5";
  save_checkpoint(path, state(1.0f));
  const auto before = read_bytes(path);
  file_faults::FaultyEnv env;
  // Write: the first piece (the payload) and the second (the header written last).
  const Case cases[] = {{Step::Create, 0}, {Step::Write, 0}, {Step::Write, 1}, {Step::Fsync, 0},
                        {Step::Close, 0},  {Step::Rename, 0}, {Step::DirFsync, 0}};
  int tried = 0;
  for (const Case& c : cases) {
    for (int err : {ENOSPC, EIO, EDQUOT, EFBIG}) {
      CAPTURE(file_faults::step_name(c.step));
      CAPTURE(c.skip);
      CAPTURE(std::strerror(err));
      bool write_error = false;
      std::string msg;
      {
        file_faults::ScopedFault fault(env, {c.step, err, c.skip, 1});
        msg = error_of([&] { save_checkpoint(path, state(2.0f), &env); }, &write_error);
        CHECK(fault.injected() == 1);
      }
      CHECK(write_error);
      CHECK(msg.rfind(path + ": ", 0) == 0);
      CHECK(msg.find('\n') == std::string::npos);
      CHECK(msg.find(std::strerror(err)) != std::string::npos);
      CHECK(read_bytes(path) == before);
      CHECK(load_checkpoint(path).groups.at("model").tensors.at("w").f32()[0] == 1.0f);
      CHECK(hidden_in(dir).empty());
      ++tried;
    }
  }
  CHECK(tried == 28);
  // With the disk fixed, the same save goes through.
  save_checkpoint(path, state(2.0f));
  CHECK(load_checkpoint(path).groups.at("model").tensors.at("w").f32()[0] == 2.0f);
  CHECK(hidden_in(dir).empty());
}

TEST_CASE("a first save that fails leaves no file at all") {
  const std::string dir = test_util::fresh_dir("save_faults_first");
  const std::string path = dir + "/best.h5";
  file_faults::FaultyEnv env;
  for (Step step : {Step::Write, Step::Rename, Step::DirFsync}) {
    CAPTURE(file_faults::step_name(step));
    file_faults::ScopedFault fault(env, {step, ENOSPC, 0, 1});
    CHECK(error_of([&] { save_checkpoint(path, state(1.0f), &env); }).find("No space left on device") != std::string::npos);
    CHECK(!fs::exists(path));
    CHECK(hidden_in(dir).empty());
  }
}

TEST_CASE("the message names the step") {
  const std::string dir = test_util::fresh_dir("save_faults_words");
  const std::string path = dir + "/last.h5";
  save_checkpoint(path, state(1.0f));
  file_faults::FaultyEnv env;
  auto message = [&](Step step) {
    file_faults::ScopedFault fault(env, {step, EIO, 0, 1});
    return error_of([&] { save_checkpoint(path, state(2.0f), &env); });
  };
  const std::string tmp = dir + "/.last.h5.tmp." + std::to_string(getpid());
  CHECK(message(Step::Create) == path + ": cannot create temporary file " + tmp + ": Input/output error");
  CHECK(message(Step::Write) == path + ": cannot write temporary file " + tmp + ": Input/output error");
  CHECK(message(Step::Fsync) == path + ": cannot fsync temporary file " + tmp + ": Input/output error");
  CHECK(message(Step::Close) == path + ": cannot close temporary file " + tmp + ": Input/output error");
  CHECK(message(Step::Rename) == path + ": cannot rename temporary file " + tmp + ": Input/output error");
  CHECK(message(Step::DirFsync) ==
        path + ": cannot fsync directory " + dir + ": Input/output error (the previous file was put back)");
}

TEST_CASE("a real EFBIG (RLIMIT_FSIZE), SIGXFSZ ignored or not, keeps the previous file") {
 for (const auto disposition : {SIG_IGN, SIG_DFL}) {
  CAPTURE(disposition == SIG_IGN);
  const std::string dir = test_util::fresh_dir("save_faults_efbig");
  const std::string path = dir + "/last.h5";
  save_checkpoint(path, state(1.0f));
  const auto before = read_bytes(path);
  REQUIRE(before.size() > 8192);
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  test_util::ChildProcess child = test_util::ChildProcess::fork_running([&] {
    alarm(20);
    // SIG_DFL kills a process that writes past the limit, unless the writer blocks it.
    signal(SIGXFSZ, disposition);
    const rlimit limit{8192, 8192};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
    bool write_error = false;
    const std::string msg = error_of([&] { save_checkpoint(path, state(2.0f)); }, &write_error);
    finish_pending_removals();
    (void)!write(pipe_fds[1], msg.data(), msg.size());
    _exit(write_error ? 0 : 1);
  });
  REQUIRE(child.pid() > 0);
  close(pipe_fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  const int status = child.wait();
  INFO(msg);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(msg.rfind(path + ": cannot write temporary file ", 0) == 0);
  CHECK(msg.find(std::strerror(EFBIG)) != std::string::npos);
  CHECK(read_bytes(path) == before);
  verify_checkpoint_file(path);
  CHECK(hidden_in(dir).empty());
 }
}

TEST_CASE("write_file_atomically replaces a file whole, or leaves it as it was") {
  const std::string dir = test_util::fresh_dir("atomic_small");
  const std::string path = dir + "/metrics.jsonl";
  file_faults::FaultyEnv env;
  write_file_atomically(env, path, "one\n");
  for (Step step : {Step::Create, Step::Write, Step::Fsync, Step::Rename, Step::DirFsync}) {
    CAPTURE(file_faults::step_name(step));
    file_faults::ScopedFault fault(env, {step, EDQUOT, 0, 1});
    CHECK(error_of([&] { write_file_atomically(env, path, "two\n"); }).find("Disk quota exceeded") != std::string::npos);
    CHECK(test_util::read_lines(path) == std::vector<std::string>{"one"});
    CHECK(hidden_in(dir).empty());
  }
  write_file_atomically(env, path, "two\n");
  CHECK(test_util::read_lines(path) == std::vector<std::string>{"two"});
}

// ---- training ----------------------------------------------------------------------

namespace {

// A short run: 512 training images, 3 epochs of 8 steps, no milestones.
const char* const kSmall[][2] = {
    {"data.train_limit", "512"}, {"data.val_split", "256"},     {"data.test_limit", "256"},
    {"data.batch_size", "64"},   {"train.epochs", "3"},         {"checkpoint.every_n_epochs", "null"},
};

enum class Writer { Async, TrainingThread };

// `Writer::TrainingThread` where a test arms a fault for one epoch from the observer: the
// epoch's saves must then happen before the next epoch begins, on the training thread.
Config small_config(const std::string& run_dir, const std::string& on_error, Writer writer = Writer::Async) {
  nlohmann::json j = default_config_json();
  j["checkpoint"]["async"] = writer == Writer::Async;
  j["device"] = "cpu";
  j["data"]["dir"] = test_util::data_dir();
  for (const auto& kv : kSmall) apply_override(j, std::string(kv[0]) + "=" + kv[1]);
  j["checkpoint"]["dir"] = run_dir;
  j["checkpoint"]["on_error"] = on_error;
  return config_from_json(j, "test");
}

// The same run through the CLI.
std::string small_cli_run(const std::string& run_dir) {
  std::string cmd = "train \"" + test_util::source_dir() + "/configs/mnist.json\" --device cpu --run-dir \"" + run_dir +
                    "\" --set data.dir=\"" + test_util::data_dir() + "\"";
  for (const auto& kv : kSmall) cmd += std::string(" --set ") + kv[0] + "=" + kv[1];
  return cmd;
}

// Makes every file write of one epoch (its checkpoints and metrics.jsonl) fail, and
// keeps the bytes last.h5 had when that epoch began. The trainer takes env().
class FailingEpoch : public TrainerObserver {
 public:
  FailingEpoch(std::string run_dir, int64_t epoch, int error) : dir_(std::move(run_dir)), epoch_(epoch), error_(error) {}
  void on_epoch_begin(int64_t epoch, int64_t, int64_t) override {
    fault_.reset();
    if (epoch != epoch_) return;
    last_before = read_bytes(dir_ + "/last.h5");
    fault_.emplace(env_, file_faults::Fault{Step::Write, error_, 0, -1});
  }
  Env* env() { return &env_; }
  void on_message(const std::string& m) override { messages.push_back(m); }
  void stop_failing() { fault_.reset(); }
  std::vector<std::string> messages;
  std::vector<unsigned char> last_before;

 private:
  std::string dir_;
  int64_t epoch_;
  int error_;
  file_faults::FaultyEnv env_;
  std::optional<file_faults::ScopedFault> fault_;
};

// An uninterrupted run, once per process.
const std::string& reference_run() {
  static const std::string dir = [] {
    const std::string d = test_util::fresh_dir("save_faults_reference");
    const Config t_cfg = small_config(d, "stop");
    Trainer t(t_cfg, Device::cpu(), make_model(t_cfg));
    if (test_util::fit_in_run_dir(t).ending != FitResult::Ending::Completed) throw std::runtime_error("the reference run did not complete");
    return d;
  }();
  return dir;
}

void expect_identical(const std::string& a, const std::string& b) {
  const CheckpointDiff d = diff_checkpoints(a, b);
  INFO(d.report);
  CHECK(d.identical);
}

}  // namespace

TEST_CASE("checkpoint.on_error = stop: a failed save stops the run; it resumes bit-exactly once the disk is fixed") {
  if (!test_util::dataset_available()) return;
  const std::string dir = test_util::fresh_dir("save_faults_stop");
  {
    FailingEpoch obs(dir, 2, ENOSPC);
    const Config t_cfg = small_config(dir, "stop", Writer::TrainingThread);
    TrainerOptions options;
    options.observer = &obs;
    options.env = obs.env();
    Trainer t(t_cfg, Device::cpu(), make_model(t_cfg), std::move(options));
    bool write_error = false;
    const std::string msg = error_of([&] { test_util::fit_in_run_dir(t); }, &write_error);
    obs.stop_failing();
    INFO(msg);
    CHECK(write_error);
    CHECK(msg.rfind(dir + "/last.h5: cannot write temporary file", 0) == 0);
    CHECK(msg.find("No space left on device") != std::string::npos);
    CHECK(t.epochs_done() == 2);  // the epoch ran; its save did not
    REQUIRE(!obs.last_before.empty());
    CHECK(read_bytes(dir + "/last.h5") == obs.last_before);  // epoch 1's file, untouched
  }
  CHECK(hidden_in(dir).empty());
  const Config resumed_cfg = small_config(dir, "stop");
  Trainer resumed(resumed_cfg, Device::cpu(), make_model(resumed_cfg));
  resumed.resume_from(dir + "/last.h5", LoadMode::Strict);
  CHECK(resumed.epochs_done() == 1);
  REQUIRE(test_util::fit_in_run_dir(resumed).ending == FitResult::Ending::Completed);
  expect_identical(reference_run() + "/last.h5", dir + "/last.h5");
  CHECK(test_util::read_lines(dir + "/metrics.jsonl").size() == test_util::read_lines(reference_run() + "/metrics.jsonl").size());
}

TEST_CASE("checkpoint.on_error = continue: a failed save warns, training goes on and the next save succeeds") {
  if (!test_util::dataset_available()) return;
  const std::string dir = test_util::fresh_dir("save_faults_continue");
  FailingEpoch obs(dir, 2, EIO);
  const Config t_cfg = small_config(dir, "continue", Writer::TrainingThread);
  TrainerOptions options;
  options.observer = &obs;
  options.env = obs.env();
  Trainer t(t_cfg, Device::cpu(), make_model(t_cfg), std::move(options));
  REQUIRE(test_util::fit_in_run_dir(t).ending == FitResult::Ending::Completed);
  int warnings = 0;
  for (const std::string& m : obs.messages)
    if (m.rfind("warning: " + dir + "/", 0) == 0 && m.find("Input/output error") != std::string::npos &&
        m.find("training goes on") != std::string::npos && m.find('\n') == std::string::npos)
      ++warnings;
  CHECK(warnings >= 2);  // last.h5 and metrics.jsonl at least
  CHECK(hidden_in(dir).empty());
  // Epoch 3's saves went through: the run ends where the uninterrupted one does.
  expect_identical(reference_run() + "/last.h5", dir + "/last.h5");
  CHECK(test_util::read_lines(dir + "/metrics.jsonl") .size() == 4);  // 3 epochs and the test line
}

TEST_CASE("engine train exits 3 when the file size limit refuses a save, and the same command resumes bit-exactly") {
  if (!test_util::dataset_available()) return;
  using test_util::run;
  const std::string dir = test_util::fresh_dir("save_faults_cli");
  const std::string cmd = small_cli_run(dir);
  REQUIRE(run(cmd + " --stop-after-epochs 1").exit_code == 0);
  const auto before = read_bytes(dir + "/last.h5");
  // A real EFBIG: a 1 MiB file size limit (bash's ulimit -f counts 1024-byte blocks),
  // SIGXFSZ left at its default disposition (death), which the engine must not depend on.
  const std::string limited = "bash -c 'ulimit -f 1024; exec \"$0\" \"$@\"' " + test_util::engine_bin() +
                              " " + cmd + " 2>&1";
  const test_util::RunResult limited_run = test_util::run_program("", limited, "");
  const std::string& out = limited_run.output;
  INFO(out);
  CHECK(limited_run.exit_code == 3);
  CHECK(out.find("engine: " + dir + "/last.h5: cannot write temporary file") != std::string::npos);
  CHECK(out.find("File too large; training stopped (checkpoint.on_error = stop)") != std::string::npos);
  CHECK(read_bytes(dir + "/last.h5") == before);
  CHECK(hidden_in(dir).empty());
  const test_util::RunResult r = run(cmd);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("resuming from epoch 1") != std::string::npos);
  expect_identical(reference_run() + "/last.h5", dir + "/last.h5");
}

TEST_CASE("checkpoint.async: a save the disk refuses surfaces at the next step or at the end, and keeps the previous file") {
  if (!test_util::dataset_available()) return;
  const std::string dir = test_util::fresh_dir("save_faults_async");
  // Every write fails from epoch 2 on, until fit() has returned: epoch 2's last.h5 fails
  // on the writer thread, and the training thread hears of it at its next step at the latest.
  class FailFromEpoch2 : public TrainerObserver {
   public:
    explicit FailFromEpoch2(std::string d) : dir_(std::move(d)) {}
    void on_epoch_begin(int64_t epoch, int64_t, int64_t) override {
      if (epoch != 2) return;
      run->flush(*trainer);  // epoch 1's files are complete before the disk "fills up"
      last_before = read_bytes(dir_ + "/last.h5");
      fault.emplace(env, file_faults::Fault{Step::Write, ENOSPC, 0, -1});
    }
    file_faults::FaultyEnv env;
    std::optional<file_faults::ScopedFault> fault;
    std::vector<unsigned char> last_before;
    RunDirectory* run = nullptr;
    Trainer* trainer = nullptr;

   private:
    std::string dir_;
  } obs(dir);
  const Config t_cfg = small_config(dir, "stop", Writer::Async);
  TrainerOptions options;
  options.observer = &obs;
  options.env = &obs.env;
  Trainer t(t_cfg, Device::cpu(), make_model(t_cfg), std::move(options));
  RunDirectory run(t);
  obs.run = &run;
  obs.trainer = &t;
  bool write_error = false;
  const std::string msg = error_of([&] { run.fit(); }, &write_error);
  obs.fault.reset();
  INFO(msg);
  CHECK(write_error);
  CHECK(msg.rfind(dir + "/last.h5: cannot write temporary file", 0) == 0);
  CHECK(msg.find("No space left on device") != std::string::npos);
  CHECK(t.epochs_done() == 2);
  CHECK(t.global_step() <= 2 * 8 + 1);  // at most one step of epoch 3 before it surfaced
  REQUIRE(!obs.last_before.empty());
  CHECK(read_bytes(dir + "/last.h5") == obs.last_before);
  CHECK(hidden_in(dir).empty());
}

TEST_CASE("a save on the writer thread writes the same bytes as one on the training thread") {
  if (!test_util::dataset_available()) return;
  const std::string dir = test_util::fresh_dir("save_faults_same_bytes");
  const Config c = small_config(dir, "stop", Writer::Async);
  // created_utc has a resolution of one second: both saves must fall in one second. Both
  // trainers are built first (the data loads are the slow part), each try starts just
  // after a second begins, and a loaded machine gets more tries.
  bool same_second = false;
  for (int attempt = 0; attempt < 20 && !same_second; ++attempt) {
    Trainer t(c, Device::cpu(), make_model(c));
    Trainer again(c, Device::cpu(), make_model(c));
    const auto now = std::chrono::system_clock::now();
    std::this_thread::sleep_until(std::chrono::ceil<std::chrono::seconds>(now) + std::chrono::milliseconds(5));
    t.control().request_stop();  // one step, then a mid-epoch last.h5 from the writer thread
    REQUIRE(test_util::fit_in_run_dir(t).stop_cause == FitResult::StopCause::Requested);
    // The same state, written on this thread. Restored from the file, since the live
    // trainer's trainer/epoch_elapsed_seconds (a wall clock, mid-epoch) has moved on.
    again.resume_from(dir + "/last.h5", LoadMode::Strict);
    again.save_checkpoint(dir + "/direct.h5");
    same_second = load_checkpoint(dir + "/direct.h5").meta.created_utc == load_checkpoint(dir + "/last.h5").meta.created_utc;
    if (same_second) CHECK(read_bytes(dir + "/direct.h5") == read_bytes(dir + "/last.h5"));
  }
  CHECK(same_second);
}

TEST_CASE("taking a run directory removes what writers that died left there, at once") {
  if (!test_util::dataset_available()) return;
  const std::string dir = test_util::fresh_dir("save_faults_leftovers");
  fs::create_directories(dir + "/tensorboard");
  // A dead writer's temporary (fresh: a SIGXFSZ or a SIGKILL a moment ago), a hidden old
  // version, and TensorBoard's temporary; a live process's pid (ours, the parent's) too:
  // the lock proves it writes nowhere here.
  const std::string parent = std::to_string(getppid());
  const std::vector<std::string> leftovers = {".last.h5.tmp.999999", ".best.h5.old.999998.3", ".metrics.jsonl.tmp." + parent,
                                              "tensorboard/.events-rewrite.tmp"};
  for (const std::string& f : leftovers) std::ofstream(dir + "/" + f) << std::string(4096, 'x');
  std::ofstream(dir + "/notes.txt") << "the user's";
  const Config c = small_config(dir, "stop");
  Trainer t(c, Device::cpu(), make_model(c));
  { RunDirectory take(t); }
  for (const std::string& f : leftovers) CHECK_MESSAGE(!fs::exists(dir + "/" + f), f);
  CHECK(fs::exists(dir + "/notes.txt"));
}
