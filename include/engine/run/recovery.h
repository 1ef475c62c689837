// Recovery on start (docs/recovery.md): which checkpoint a run resumes from. A run's
// full-state checkpoints live in tiers: the run directory (checkpoint.dir) first, then
// each of checkpoint.replicas, in order. Every copy in every tier (last.h5, the
// milestones epoch_NNNN.h5, best_epoch_NNNN.h5, best.h5) is loaded as a resume would
// load it (header, checksums, the sandboxed parser, structure) and its run identity is
// compared with the run's; the newest sound copy of this run, by global step, is the one
// to resume from. RunSession::begin applies it; a host may call these itself.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "engine/io/env.h"
#include "engine/train/config.h"

namespace engine {

// What makes two checkpoints the same run: the seed, and a hash of the resolved config
// without what may change between the sessions of one run (device, data.dir,
// data.test_limit, train.*, checkpoint.*, logging.*, cuda.*, dist.backend,
// dist.timeout_s). The engine is deterministic, so every sound checkpoint of one
// identity lies on the one trajectory of that run.
struct RunIdentity {
  uint64_t seed = 0;
  uint64_t config_hash = 0;
  bool operator==(const RunIdentity& o) const { return seed == o.seed && config_hash == o.config_hash; }
  bool operator!=(const RunIdentity& o) const { return !(*this == o); }
};
RunIdentity run_identity(const Config& cfg);
// "seed 0, config 1f0de1f0a2b3c4d5".
std::string to_string(const RunIdentity& id);

enum class CopyVerdict {
  Sound,     // loads, and belongs to this run
  Damaged,   // does not load: corrupt, truncated, empty, unreadable, not a checkpoint
  OtherRun,  // loads, but another run's (another seed or config)
};

// One checkpoint file of one tier, as the survey found it.
struct CheckpointCopy {
  std::string path;  // dir/file
  std::string dir;   // its tier
  std::string file;  // "last.h5", "epoch_0004.h5", "best_epoch_0003.h5", "best.h5"
  CopyVerdict verdict = CopyVerdict::Damaged;
  // Why it is not sound, one line without the path: the load error, or how the run
  // differs ("seed 1 there, 0 here").
  std::string reason;
  // Its counters (when it loads).
  int64_t global_step = -1, epochs_done = -1, step_in_epoch = -1;
};

// Every tier's copies, in the order of preference for equal global steps: the run
// directory before the replicas, and within a tier last.h5, the milestones and
// best_epoch files (newest first), best.h5.
struct RunSurvey {
  std::vector<std::string> tiers;     // checkpoint.dir, then checkpoint.replicas
  std::vector<CheckpointCopy> copies;
  std::optional<std::size_t> chosen;  // the newest sound copy, an index into copies
  // The chosen copy as loaded (set when chosen is).
  std::optional<Checkpoint> state;

  const CheckpointCopy* chosen_copy() const { return chosen ? &copies[*chosen] : nullptr; }
  // The copies that were not used because they are damaged or another run's (the newer
  // ones, and those whose age cannot be told).
  std::vector<const CheckpointCopy*> skipped() const;
  // "runs/x/last.h5: checksum mismatch (file is corrupt) ...; runs/x/best.h5: truncated: ..."
  std::string skipped_text() const;
  // Whether the run directory holds a sound checkpoint of another run.
  const CheckpointCopy* other_run_in_run_dir() const;
};

// Surveys every tier of `cfg` (checkpoint.dir, checkpoint.replicas) for checkpoints of
// the run `cfg` describes. A tier that does not exist or cannot be listed holds nothing.
// Reads through `env` (null: Env::posix()).
RunSurvey survey_run(const Config& cfg, Env* env = nullptr);

// The checkpoint files of one directory, loaded (the identity is not checked: every
// copy that loads is Sound), newest first. For `engine resume RUN_DIR`, and to name the
// sound alternatives of a file that does not load.
std::vector<CheckpointCopy> survey_directory(const std::string& dir, Env* env = nullptr);

// What to add to the error of `path`, a checkpoint that does not load: the sound
// checkpoints beside it, newest first ("; sound checkpoints beside it: runs/x/epoch_0002.h5
// (epoch 2, global step 32), ...; `engine resume runs/x` resumes from the newest"), or
// "" when there is none.
std::string sound_alternatives(const std::string& path, Env* env = nullptr);

// The memory tier (checkpoint.memory_tier; docs/recovery.md, "The memory tier"): the
// newest sound slot of this run's slot file, checked as a disk copy is (its seal, the
// digest of its bytes, its state, and this run's identity). Never throws.
struct MemoryTierSurvey {
  std::string file;  // the slot file ("" when checkpoint.memory_tier is null)
  // The chosen slot (path "<file> slot N", dir the tier's directory, file "slot N"),
  // and its state.
  std::optional<CheckpointCopy> copy;
  std::optional<Checkpoint> state;
  // Why the file or a slot was not used, one line each ("<file> slot 1: torn: ..."); a
  // missing file and a slot never written are not worth a line.
  std::vector<std::string> skipped;
};
MemoryTierSurvey survey_memory_tier(const Config& cfg);

// Whether a file name is one of the full-state checkpoints a run directory holds.
bool is_run_checkpoint(const std::string& file);

}  // namespace engine
