// One writer per run directory. A training run (a RunDirectory, which `engine train` and
// `engine resume` use) holds an advisory flock(2) on <run-dir>/.lock for as long as it runs; a
// second writer is refused at once with a line naming the holder. The kernel drops the
// lock when its holder dies, however it dies, so a lock left by a dead process never
// blocks; the file's text (pid, host, since when) is rewritten by every new holder and
// emptied on a clean release. Readers (eval, inspect, verify, diff) take no lock. The
// file, the flock and the time in the text go through an Env (engine/io/env.h).
#pragma once
#include <stdexcept>
#include <string>

#include "engine/io/env.h"

namespace engine {

// Another process (or another lock in this one) holds the run directory.
class RunDirBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunDirLock {
 public:
  // Takes the lock on `run_dir` (which must exist) without waiting; throws RunDirBusy
  // naming the holder, or std::runtime_error naming the file when it cannot be opened.
  // Through `env` (null: Env::posix()), which must outlive the lock.
  static RunDirLock acquire(const std::string& run_dir, Env* env = nullptr);

  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();

  const std::string& dir() const { return dir_; }
  static std::string lock_path(const std::string& run_dir);

 private:
  RunDirLock(Env& env, int fd, std::string dir) : env_(&env), fd_(fd), dir_(std::move(dir)) {}
  void release() noexcept;
  Env* env_ = nullptr;
  int fd_ = -1;
  std::string dir_;
};

}  // namespace engine
