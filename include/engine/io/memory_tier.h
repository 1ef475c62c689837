// The memory tier (docs/recovery.md, "The memory tier"): the state after every training
// step, kept in a file of shared memory (checkpoint.memory_tier, /dev/shm by default) that
// outlives a SIGKILL of the process but not a reboot or the host. The file holds two
// slots written in turn; each is sealed only once it is complete, with the digest of its
// bytes, so a kill in the middle of a write leaves the other slot sound.
//
// The file is this host's and this user's: host byte order, owned by the user and
// writable by nobody else, named for the run directory. Layout: docs/recovery.md.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"

namespace engine::memory_tier {

inline constexpr uint32_t kLayoutVersion = 1;

// The slot file of the run directory `run_dir` in `dir`:
// "<dir>/engine-<uid>-<16 hex digits of a hash of run_dir's absolute path>.slots".
std::string file_for(const std::string& dir, const std::string& run_dir);
// run_dir as the file records it: absolute, with "." and ".." resolved.
std::string canonical_run_dir(const std::string& run_dir);

struct Slot {
  int index = 0;           // 0 or 1
  bool sealed = false;     // its write completed
  uint64_t sequence = 0;   // the file's count of writes when this one was sealed
  int64_t global_step = -1;
  uint64_t payload_bytes = 0;
  uint64_t digest = 0;     // as the seal records it
  // Why it is not to be trusted, one line ("" when it is sound): "never written", "torn:
  // its write did not complete (a kill during it)", "checksum mismatch ...".
  std::string problem;
  std::optional<Checkpoint> state;  // when sound and read with Read::States
};

struct Contents {
  std::string path;
  std::string run_dir;  // as the file records it
  uint64_t slot_bytes = 0;
  // Why the file as a whole is not used ("" when it is readable): missing, not this
  // user's, another run directory's, truncated, not a slot file. Then `slots` is empty.
  std::string problem;
  std::vector<Slot> slots;
  // The sound slot written last, or null.
  const Slot* newest() const;
};

enum class Read {
  Seals,   // the seals only: what `engine inspect` lists without reading the state
  States,  // every sealed slot read, its digest checked, its state parsed
};

// Reads `path`. `expected_run_dir` (canonical_run_dir form; "" accepts any) must be the
// one the file records. Never throws for a bad file: the reason is in `problem`.
Contents read(const std::string& path, const std::string& expected_run_dir, Read what);

// Writes a run's slots. Not thread-safe: the training thread's, between steps.
class Writer {
 public:
  // The slot file for `run_dir` in `dir`: an existing one of this run directory is kept
  // (its newest sound slot is not written over until the next write is sealed), anything
  // else at that name that this user may replace is replaced. Throws std::runtime_error,
  // one line naming the file, when it cannot be created or mapped (another user's file
  // at that name, a full /dev/shm).
  Writer(const std::string& dir, const std::string& run_dir);
  ~Writer();  // unmaps; the file stays (remove() takes it away)
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Copies `state` (CPU tensors) into the slot not holding the newest sound state, and
  // seals it. A state larger than a slot makes a larger file first (written whole and
  // renamed over the old one). Throws std::runtime_error naming the file on failure.
  void write(const Checkpoint& state, int64_t global_step);
  // Unlinks the file (a run that ended, or --fresh).
  void remove();
  const std::string& path() const;
  // The bytes of state the last write() copied.
  uint64_t last_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether `path` is a slot file (it starts with the layout's magic); never throws.
bool is_slot_file(const std::string& path);
// What `engine inspect` prints of a slot file: its run directory and each slot (sealed or
// why not, its step, its size), read and checked as a resume would.
std::string describe(const Contents& c);

// Removes the slot files in `dir` that belong to this user and whose run directory no
// longer exists (the run was deleted). Returns the paths removed. Never throws.
std::vector<std::string> remove_abandoned(const std::string& dir);

}  // namespace engine::memory_tier
