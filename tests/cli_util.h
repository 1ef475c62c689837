// Runs the `engine` binary (path from $ENGINE_BIN, set by CTest) and captures its output.
#pragma once
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/child_process.h"

namespace test_util {

struct RunResult {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  std::string output;   // stdout and stderr together
};

inline std::string engine_bin() {
  const char* b = std::getenv("ENGINE_BIN");
  return b ? b : "./engine";
}

// $ENGINE_SOURCE_DIR (set by CTest); run by hand, the nearest directory upwards from the
// working directory that holds configs/mnist.json.
inline std::string source_dir() {
  if (const char* s = std::getenv("ENGINE_SOURCE_DIR")) return s;
  namespace fs = std::filesystem;
  for (fs::path dir = fs::current_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / "configs" / "mnist.json")) return dir.string();
    if (dir == dir.parent_path()) break;
  }
  return ".";
}

// A fresh, empty directory under $ENGINE_TEST_TMP (or /tmp).
inline std::string fresh_dir(const std::string& name) {
  const char* t = std::getenv("ENGINE_TEST_TMP");
  std::filesystem::path p = std::filesystem::path(t ? t : "/tmp") / ("engine_test_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// The wait status as a RunResult's exit code and signal.
// `through_shell`: the status is a shell's, which reports a child killed by signal N as
// 128+N (the engine's own 130 and 137 are then read as signals too, as they always were
// for run()).
inline void set_status(RunResult& r, int status, bool through_shell) {
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (through_shell && r.exit_code > 128 && r.signal == 0) r.signal = r.exit_code - 128, r.exit_code = -1;
}

// Runs `program args` with extra environment assignments ("A=1 B=2") before it, in a
// child that dies with the test (ChildProcess).
inline RunResult run_program(const std::string& env, const std::string& program, const std::string& args) {
  RunResult r;
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + program + " " + args + " 2>&1";
  ChildProcess child = ChildProcess::shell(cmd);
  if (!child.output()) return r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, child.output())) > 0) r.output.append(buf, n);
  set_status(r, child.wait(), true);
  return r;
}

// Runs the engine with extra environment assignments ("A=1 B=2") before the command.
inline RunResult run_with_env(const std::string& env, const std::string& args) {
  return run_program(env, engine_bin(), args);
}

inline RunResult run(const std::string& args) { return run_with_env("", args); }

// tests/tools/engine_paused.cpp (path from $ENGINE_PAUSED_BIN): `engine` held at a step.
inline std::string paused_bin() {
  const char* b = std::getenv("ENGINE_PAUSED_BIN");
  return b ? b : "./engine_paused";
}

// `engine ARGS` held after global step `step` until one signal reaches it (the pause
// options of engine_paused.cpp, e.g. "--release-after-signals 2"), as a command line for
// Background or run_program: "PAUSED_BIN --at-step N OPTIONS -- ARGS".
inline std::string paused_at(int64_t step, const std::string& args, const std::string& options = "") {
  return paused_bin() + " --at-step " + std::to_string(step) + (options.empty() ? "" : " " + options) + " -- " +
         args;
}

// A process running in the background (by default `engine ARGS`; Background::command
// runs any command line), its output read line by line, so a test can signal it at a
// known point of the run. It is killed when the Background goes out of scope unfinished:
// a failed REQUIRE leaves nothing running.
class Background {
 public:
  explicit Background(const std::string& args) : Background(engine_bin() + " " + args, 0) {}
  static Background command(const std::string& command_line) { return Background(command_line, 0); }

  int pid() const { return child_.pid(); }
  const std::string& output() const { return output_; }
  // Reads until a line containing `needle` (true) or the end of the output (false).
  bool wait_for(const std::string& needle) {
    for (std::string l; next_line(l);)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
  // Reads the rest and waits for the exit.
  RunResult finish() {
    for (std::string l; next_line(l);) {}
    RunResult r;
    r.output = output_;
    set_status(r, child_.wait(), false);
    return r;
  }

 private:
  Background(const std::string& command_line, int)
      : child_(ChildProcess::shell("exec " + command_line + " 2>&1")) {}  // exec: the pid is the program's
  bool next_line(std::string& line) {
    char buf[4096];
    if (!child_.output() || !fgets(buf, sizeof buf, child_.output())) return false;
    line = buf;
    output_ += line;
    return true;
  }
  ChildProcess child_;
  std::string output_;
};
// `args` is an `engine train ...` command line; the run SIGKILLs itself right after
// global step `step` (tests/tools/engine_kill_after.cpp, path from $ENGINE_KILL_AFTER_BIN).
inline RunResult run_killed_after_step(int64_t step, const std::string& args) {
  const char* b = std::getenv("ENGINE_KILL_AFTER_BIN");
  return run_program("", b ? b : "./engine_kill_after", std::to_string(step) + " " + args);
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// The Fashion-MNIST directory: $ENGINE_DATA_DIR (e.g. on a GPU machine where the files
// travel with the tree), else Debian's location.
inline std::string data_dir() {
  const char* d = std::getenv("ENGINE_DATA_DIR");
  return d ? d : "/usr/share/datasets/fashion-mnist";
}

inline bool dataset_available() {
  return std::filesystem::exists(data_dir() + "/train-images-idx3-ubyte.gz") ||
         std::filesystem::exists(data_dir() + "/train-images-idx3-ubyte");
}

// A small, quick run: 1024 training images, 4 epochs, on `device` (cpu, cuda).
inline std::string small_run(const std::string& run_dir, const std::string& device = "cpu") {
  return "train \"" + source_dir() + "/configs/mnist.json\" --device " + device + " --run-dir \"" + run_dir +
         "\" --set data.dir=\"" + data_dir() + "\" --set data.train_limit=1024 --set data.val_split=512 --set data.test_limit=512"
         " --set data.batch_size=64 --set train.epochs=4 --set checkpoint.every_n_epochs=2";
}

}  // namespace test_util
