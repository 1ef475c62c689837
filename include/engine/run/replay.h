// Replay (docs/replay.md): the engine's bits are a function of the config, the data and
// the seed, so a run can be trained again to any step, from its start or from any of its
// checkpoints, and give the same state. `engine replay`, `engine bisect` and
// `engine audit` are built on these.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/core/device.h"
#include "engine/io/checkpoint.h"
#include "engine/io/step_digest.h"
#include "engine/train/trainer.h"

namespace engine {

struct ReplayOptions {
  Device device = Device::cpu();
  std::string data_dir;  // replaces the stored config's data.dir when not empty
  TrainerObserver* observer = nullptr;
};

enum class ReplayFrom {
  Checkpoint,  // the checkpoint's own state
  RunStart,    // its run's start: the stored config and seed, step 0
};

// A trainer for `ckpt` (loaded from `path`): built from its stored config on
// options.device, and at the checkpoint's state or at the run's start. Throws
// CheckpointError naming `path` when the config is unusable or the state does not load.
std::unique_ptr<Trainer> replay_trainer(const Checkpoint& ckpt, const std::string& path, ReplayFrom from,
                                        const ReplayOptions& options);

// Trains `trainer` step by step (Trainer::train_step: an epoch's last step includes its
// end, as in fit()) until its global step is `to`. After each step, `after_step` gets
// the step's record (null when train.step_digests is off) and may return false to stop
// there; between steps it may also change the CPU threads (set_cpu_threads). Returns
// the global step reached. Throws std::invalid_argument when `to` is behind the trainer
// or beyond the run's last step.
int64_t replay_to(Trainer& trainer, int64_t to, const std::function<bool(const StepDigest*)>& after_step = {});

// The last global step of a run with this trainer's config (train.epochs epochs).
int64_t last_step_of_run(Trainer& trainer);

}  // namespace engine
