// Private to io/: atomic, durable replacement of a file (checkpoints, metrics.jsonl).
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>

#include "engine/io/env.h"

namespace engine {

// While one lives, SIGXFSZ is blocked on the calling thread, so that a write past the
// file size limit (RLIMIT_FSIZE, `ulimit -f`) fails with EFBIG, a disk error like any
// other, instead of killing the process: the library does not depend on its host's
// signal dispositions. A SIGXFSZ raised meanwhile is consumed before the mask is put back.
class ScopedSigxfszBlock {
 public:
  ScopedSigxfszBlock();
  ~ScopedSigxfszBlock();
  ScopedSigxfszBlock(const ScopedSigxfszBlock&) = delete;
  ScopedSigxfszBlock& operator=(const ScopedSigxfszBlock&) = delete;

 private:
  sigset_t previous_;
  bool was_blocked_ = false;
};

// env.pwrite of all `n` bytes at `offset`; 0 or the errno of the failure.
int write_fully_at(Env& env, int fd, const unsigned char* data, std::size_t n, off_t offset);

// Writes a new file under `path` atomically: `write_content(fd)` fills a temporary
// file in the same directory (returning 0 or an errno), which is fsynced, renamed over
// `path`, and the directory fsynced. On failure the previous file at `path` is
// untouched (put back if the directory fsync fails after the rename), no temporary file
// is left, and a one-line CheckpointWriteError names `path`, the step and the errno
// text. A `path` that exists and is not a regular file is refused (CheckpointError).
// Every call goes through `env`; with an Env other than Env::posix() the removal of the
// replaced version is waited for before this returns (the Env may not outlive the call).
void atomic_write(Env& env, const std::string& path, const std::function<int(int)>& write_content);

// atomic_write of `bytes` (metrics.jsonl and other small files of a run).
void write_file_atomically(Env& env, const std::string& path, const std::string& bytes);

}  // namespace engine
