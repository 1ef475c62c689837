// Checkpoint files: the engine's own HDF5 layout (docs/checkpoint-format.md).
// Every stateful component hands over a StateDict; this layer stores them generically,
// writes atomically (a crash mid-save never damages the previous file), checksums the
// whole file, and refuses anything damaged, foreign or too new with one line naming
// the file, so a resumed run either continues bit for bit or does not start.
// Not thread-safe (the HDF5 library is built without thread safety): call these from
// one thread at a time. Each function that touches a file takes the Env to do it through
// (engine/io/env.h; null: Env::posix()).
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/io/env.h"
#include "engine/core/state.h"

namespace engine {

inline constexpr int64_t kCheckpointFormatVersion = 4;

// One line, always starting with the file's path.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A save that the disk refused: creating, writing, fsyncing or renaming the file failed
// (disk full, I/O error, quota, file size limit). The file that was at the path before
// the save is still there, unchanged, and no temporary file is left. Training decides
// what to do next with checkpoint.on_error (docs/config.md).
struct CheckpointWriteError : CheckpointError {
  using CheckpointError::CheckpointError;
};

struct CheckpointMeta {
  int64_t format_version = kCheckpointFormatVersion;
  std::string engine_version;
  std::string created_utc;  // ISO 8601, "2024-05-01T12:34:56Z"
  std::string saved_on;     // device the run trained on: "cpu", "cuda:0"
};

struct Checkpoint {
  // save_checkpoint fills format_version, engine_version and created_utc itself;
  // the caller sets saved_on.
  CheckpointMeta meta;
  std::string config_json;  // the resolved config as JSON text
  // "model", "optimizer", "scheduler", "scaler", "rng", "trainer", "metrics" (all
  // required); further groups (any name without '/' or NUL) are stored and loaded the
  // same way.
  std::map<std::string, StateDict> groups;

  // The group `name`; throws CheckpointError listing the groups present when absent.
  // Tensors and scalars by name: group("model").get_tensor("fc1.weight"),
  // group("trainer").get_int("epoch") (engine/core/state.h).
  const StateDict& group(const std::string& name) const;
  // A copy whose tensors all live on `device` (scalars, config and metadata as they are).
  Checkpoint to(Device device) const;
};

// The groups every checkpoint must have.
const std::vector<std::string>& checkpoint_required_groups();

// Writes atomically: the file is built in memory, written to a temporary file in the
// same directory, fsynced, renamed over `path`, and the directory fsynced. On failure
// the previous file at `path` is untouched (a failure of the disk is a
// CheckpointWriteError). `path` must not name a directory, FIFO or device. Tensors may
// live on any device. created_utc is env's wall_now().
void save_checkpoint(const std::string& path, const Checkpoint& ckpt, Env* env = nullptr);

// Verifies header, length and checksum, then structure, then reads. Tensors come back
// on the CPU. Model and optimizer keys come back without wrapper prefixes.
Checkpoint load_checkpoint(const std::string& path, Env* env = nullptr);

// load_checkpoint, then every tensor copied to `device` (a checkpoint saved on a GPU
// read onto the CPU, or the reverse).
Checkpoint load_checkpoint(const std::string& path, Device device, Env* env = nullptr);
// Starts the process in which load_checkpoint has libhdf5 parse files
// (docs/security.md); the first load starts it otherwise. It is a fork of the calling
// process and shares its memory as it is at that moment, so a program that loads
// checkpoints later, after large allocations, calls this early. A failure to start it
// is reported by the next load.
void start_checkpoint_parser();

// How the checkpoint parser is confined (docs/security.md). Its seccomp filter, which
// keeps a parser subverted by a file from opening files, starting programs or signalling
// others, is installed where the kernel allows it; under qemu-user, or a container that
// forbids filters, the parser runs without it unless ENGINE_PARSER_SECCOMP=require, which
// makes every load refuse instead. Starts the parser if none runs.
struct CheckpointParserConfinement {
  bool seccomp_filter = false;  // the filter is installed in the parser process
  std::string reason;           // why not: "prctl(PR_SET_SECCOMP): Invalid argument", ...
  std::string summary;          // one line: "seccomp filter", or what is missing and why
};
CheckpointParserConfinement checkpoint_parser_confinement();

// Everything load_checkpoint checks, without keeping the result, and, in a trainer's
// checkpoint, that the stored tensors give the step digest it carries
// (trainer/step_digest, engine/io/step_digest.h).
void verify_checkpoint_file(const std::string& path, Env* env = nullptr);

// Human-readable summary: metadata, then per group its scalars and its tensors with
// dtype, shape and L2 norm.
std::string inspect_checkpoint(const std::string& path, Env* env = nullptr);

struct CheckpointDiff {
  bool identical = false;  // same keys, every tensor bit-identical, every scalar equal
  std::string report;      // one line per key
};
// Compares two checkpoints key by key. Metadata (created_utc, engine_version, saved_on,
// format_version), the config and wall-clock timings (metrics series named *_seconds)
// are reported when they differ but do not count against `identical`: two runs in
// different directories, timed differently, can hold bit-identical state.
CheckpointDiff diff_checkpoints(const std::string& a, const std::string& b, Env* env = nullptr);

// Strips the wrapper prefixes "_orig_mod." and "module." (torch.compile,
// DataParallel) from a parameter name, repeatedly.
std::string strip_wrapper_prefixes(const std::string& name);

}  // namespace engine
