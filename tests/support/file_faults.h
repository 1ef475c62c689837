// Test-only (engine_testing, never in libengine.a): an Env (engine/io/env.h) that makes a
// chosen call fail with a chosen errno (disk full, I/O error, quota, file size limit, a
// lock or a listing refused) without reaching the system. It is passed to the code under
// test like any Env: the Trainer, RunSessionOptions::env, RunDirLock::acquire, the
// checkpoint functions.
#pragma once
#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "engine/io/env.h"

namespace engine::file_faults {

// The calls of an Env a fault can hit: the six steps of a file replacement first.
enum class Step {
  Create, Write, Fsync, Close, Rename, DirFsync,
  OpenForReading, Fstat, Read,
  Stat, Link, Remove, ListDir, MakeDirs,
  OpenLockFile, Lock, Truncate,
  OpenForAppending,
};
const char* step_name(Step step);  // "create", "write", ...

// The `skip`+1-th call of `step` and the `times`-1 after it (times < 0: every one after
// it) fail with `error`. With `path_part`, only the calls on a path containing it count
// (a descriptor's calls count under the path it was opened with).
struct Fault {
  Step step = Step::Write;
  int error = 0;
  int skip = 0;
  int times = 1;
  std::string path_part;
};

// `target` (Env::posix() by default) with at most one fault armed at a time. Every thread
// sees it (the writer thread's saves fail too). Must outlive the objects it is given to;
// its destructor waits for the removals queued through it.
class FaultyEnv final : public EnvWrapper {
 public:
  explicit FaultyEnv(Env& target = Env::posix()) : EnvWrapper(target) {}
  ~FaultyEnv() override;

  int create(const std::string& path, mode_t mode) override;
  ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) override;
  int fsync(int fd) override;
  int close(int fd) override;
  int rename(const std::string& from, const std::string& to) override;
  int fsync_dir(const std::string& dir) override;
  int open_for_reading(const std::string& path) override;
  int fstat(int fd, FileInfo& info) override;
  ssize_t pread(int fd, void* data, std::size_t n, off_t offset) override;
  int open_for_appending(const std::string& path) override;
  int stat(const std::string& path, FileInfo& info) override;
  int link(const std::string& from, const std::string& to) override;
  int remove(const std::string& path) override;
  int list_dir(const std::string& dir, std::vector<std::string>& names) override;
  int make_dirs(const std::string& dir) override;
  int open_lock_file(const std::string& path) override;
  int try_lock(int fd) override;
  int truncate(int fd, off_t size) override;

 private:
  friend class ScopedFault;
  void arm(const Fault& fault);
  void disarm();
  int failed() const;
  // Whether this call of `step` on `path` (or `other_path`) is to fail; sets errno when it is.
  bool fails(Step step, const std::string& path, const std::string& other_path = "");
  bool fails_on(Step step, int fd);
  // The descriptor `fd` came from `path` (when `fd` is one).
  int opened(int fd, const std::string& path);

  std::atomic<bool> armed_{false};
  mutable std::mutex mutex_;
  Fault active_;                         // guarded by mutex_
  int seen_ = 0;                         // calls of active_ so far
  int failed_ = 0;                       // of which failed
  std::map<int, std::string> fd_paths_;  // open descriptors' paths
};

// Arms `fault` on `env` for as long as it lives.
class ScopedFault {
 public:
  ScopedFault(FaultyEnv& env, const Fault& fault);
  ~ScopedFault();
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
  int injected() const;  // how many calls failed so far

 private:
  FaultyEnv& env_;
};

}  // namespace engine::file_faults
