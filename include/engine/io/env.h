// The run's contact with the operating system, in the manner of LevelDB's Env: every
// file a run reads, writes, lists, locks or removes, and the clocks it reads, go through
// one Env. Env::posix() is the real one; a host passes its own (a wrapper that counts,
// traces or fails calls, a fake clock) to the objects that do the I/O, as LevelDB's
// Options::env: RunSessionOptions::env, TrainerOptions::env (the trainer's RunDirectory
// uses it too), RunDirLock::acquire, and the checkpoint functions (engine/io/checkpoint.h).
// A null Env* always means Env::posix(). docs/embedding.md, "Your own Env".
//
// The calls are the system calls' own: -1 (or a null result) and errno on failure, so
// that the library's messages read the same whichever Env is passed. Every method may be
// called from several threads at once (checkpoints are written on a writer thread and
// read with two threads). An Env must outlive every object and call it was given to; the
// library calls it no later than that (a save through an Env other than posix() waits for
// the removal of the version it replaced, which posix() leaves to a background thread).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace engine {

enum class FileKind { Regular, Directory, Other };

// What stat(2) says of a file, as far as the engine asks.
struct FileInfo {
  FileKind kind = FileKind::Other;
  std::size_t size = 0;
  std::chrono::system_clock::time_point modified;
};

class Env {
 public:
  virtual ~Env() = default;

  // The system calls and the system's clocks. One object for the whole process.
  static Env& posix();

  // ---- replacing a file (temporary, write, fsync, close, rename, directory fsync) ----
  // open(O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode); EINTR retried.
  virtual int create(const std::string& path, mode_t mode) = 0;
  virtual ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) = 0;
  virtual int fsync(int fd) = 0;
  virtual int close(int fd) = 0;  // the descriptor is closed even when this fails
  virtual int rename(const std::string& from, const std::string& to) = 0;
  // Opens `dir`, fsyncs it and closes it.
  virtual int fsync_dir(const std::string& dir) = 0;

  // ---- reading ----
  // open(O_RDONLY | O_NONBLOCK | O_CLOEXEC): a FIFO with no writer does not block.
  virtual int open_for_reading(const std::string& path) = 0;
  virtual int fstat(int fd, FileInfo& info) = 0;
  virtual ssize_t pread(int fd, void* data, std::size_t n, off_t offset) = 0;

  // ---- appending to a log (step_digests.jsonl) ----
  // open(O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644); EINTR retried. Unlike
  // create() it keeps what the file holds; the caller writes with pwrite at its end.
  virtual int open_for_appending(const std::string& path) = 0;

  // ---- files and directories ----
  virtual int stat(const std::string& path, FileInfo& info) = 0;  // follows symbolic links
  virtual int link(const std::string& from, const std::string& to) = 0;
  virtual int remove(const std::string& path) = 0;  // unlink(2): a file, not a directory
  // The names in `dir` ("." and ".." left out), in the order the system gives them.
  virtual int list_dir(const std::string& dir, std::vector<std::string>& names) = 0;
  // `dir` and any missing parents (std::filesystem::create_directories); 0 when it exists.
  virtual int make_dirs(const std::string& dir) = 0;

  // ---- the run directory's lock ----
  // open(O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644).
  virtual int open_lock_file(const std::string& path) = 0;
  // flock(LOCK_EX | LOCK_NB): EWOULDBLOCK while another descriptor holds it. Closing the
  // descriptor releases it.
  virtual int try_lock(int fd) = 0;
  virtual int truncate(int fd, off_t size) = 0;  // ftruncate(2)

  // ---- clocks ----
  // Timestamps: checkpoints' created_utc, the lock's "since", file names.
  virtual std::chrono::system_clock::time_point wall_now() = 0;
  // Durations: the time limit, epoch and save timings.
  virtual std::chrono::steady_clock::time_point monotonic_now() = 0;
};

// An Env that hands every call to `target`: derive from it and override only the calls
// to change (as LevelDB's EnvWrapper).
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env& target) : target_(target) {}
  Env& target() const { return target_; }

  int create(const std::string& path, mode_t mode) override { return target_.create(path, mode); }
  ssize_t pwrite(int fd, const void* data, std::size_t n, off_t offset) override {
    return target_.pwrite(fd, data, n, offset);
  }
  int fsync(int fd) override { return target_.fsync(fd); }
  int close(int fd) override { return target_.close(fd); }
  int rename(const std::string& from, const std::string& to) override { return target_.rename(from, to); }
  int fsync_dir(const std::string& dir) override { return target_.fsync_dir(dir); }
  int open_for_reading(const std::string& path) override { return target_.open_for_reading(path); }
  int fstat(int fd, FileInfo& info) override { return target_.fstat(fd, info); }
  ssize_t pread(int fd, void* data, std::size_t n, off_t offset) override { return target_.pread(fd, data, n, offset); }
  int open_for_appending(const std::string& path) override { return target_.open_for_appending(path); }
  int stat(const std::string& path, FileInfo& info) override { return target_.stat(path, info); }
  int link(const std::string& from, const std::string& to) override { return target_.link(from, to); }
  int remove(const std::string& path) override { return target_.remove(path); }
  int list_dir(const std::string& dir, std::vector<std::string>& names) override {
    return target_.list_dir(dir, names);
  }
  int make_dirs(const std::string& dir) override { return target_.make_dirs(dir); }
  int open_lock_file(const std::string& path) override { return target_.open_lock_file(path); }
  int try_lock(int fd) override { return target_.try_lock(fd); }
  int truncate(int fd, off_t size) override { return target_.truncate(fd, size); }
  std::chrono::system_clock::time_point wall_now() override { return target_.wall_now(); }
  std::chrono::steady_clock::time_point monotonic_now() override { return target_.monotonic_now(); }

 private:
  Env& target_;
};

// `env`, or Env::posix() when it is null: what every Env* parameter and field means.
inline Env& env_or_posix(Env* env) { return env ? *env : Env::posix(); }

}  // namespace engine
