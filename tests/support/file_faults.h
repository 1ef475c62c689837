// Test-only (engine_testing, never in libengine.a): a file-operations implementation
// (io/file_ops.h) that makes a chosen step of a save fail with a chosen errno (disk full,
// I/O error, quota, file size limit) without reaching the system.
#pragma once
#include "io/file_ops.h"

namespace engine::file_faults {

using file_ops::Step;

// While a ScopedFault lives, the `skip`+1-th call of `step` and the `times`-1 after it
// (times < 0: every one after it) fail with `error`. One fault at a time, process-wide
// (the writer thread's saves fail too).
struct Fault {
  Step step = Step::Write;
  int error = 0;
  int skip = 0;
  int times = 1;
};
class ScopedFault {
 public:
  explicit ScopedFault(const Fault& fault);
  ~ScopedFault();
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
  int injected() const;  // how many calls failed so far
};

}  // namespace engine::file_faults
