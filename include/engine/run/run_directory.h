// A training run's directory, <run-dir> (cfg.checkpoint.dir): everything fit() leaves on
// disk. It holds the directory's lock (engine/run/run_lock.h) for as long as it lives, names
// and rotates the checkpoints (last.h5, best.h5, epoch_NNNN.h5), verifies each save,
// writes metrics.jsonl and the TensorBoard events, and tells the time limit what a save
// costs. With checkpoint.async (the default) a writer thread serialises, writes, fsyncs,
// renames and verifies each checkpoint while training goes on; the training thread only
// copies the state into a reusable snapshot buffer, and waits only while the previous
// checkpoint still holds that buffer.
//
//   TrainerOptions options;
//   options.observer = &observer;
//   Trainer trainer(cfg, device, make_model(cfg), std::move(options));
//   RunDirectory run(trainer);      // takes <run-dir>/.lock; RunDirBusy when taken
//   FitResult r = run.fit(stop);    // trainer.fit(stop, &run)
//
// Each epoch's line of metrics.jsonl carries, after the fields of epoch_metric_fields(),
// "saves": [{"file", "global_step", "stall_seconds"}...] for the saves this process made
// in that epoch (absent for epochs trained by an earlier process).
//
// A Trainer without a RunDirectory writes nothing (a data-parallel rank other than 0).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/run/recovery.h"
#include "engine/run/run_lock.h"
#include "engine/train/trainer.h"

namespace engine {

// What one checkpoint save cost.
struct SaveRecord {
  std::string file;           // "last.h5", "best.h5", "epoch_0005.h5"
  int64_t epoch = 0;          // the epoch (1-based) the save belongs to: its line in metrics.jsonl
  int64_t global_step = 0;
  // The training thread's part: waiting for the save before it (at most one is in
  // flight) and copying the state into the snapshot buffer. With checkpoint.async off,
  // the whole save.
  double stall_seconds = 0;
  // From the request until the file was written, renamed and verified (0 until then).
  double total_seconds = 0;
};

// What a RunDirectory is to its run.
enum class RunDirRole {
  Owner,     // the run directory: checkpoint.on_error governs its saves; it writes the replicas
  PeerCopy,  // checkpoint.peer_replica's copy on another host: no replicas, and a save that
             // fails is reported once per kind of failure, never stops training
};

class RunDirectory final : public RunSink {
 public:
  // The run directory of `trainer` (trainer.config().checkpoint.dir, created when
  // absent), locked for this object's lifetime with `lock` when it is one for that
  // directory, else with a lock taken here (throws RunDirBusy). Taking the directory
  // removes what a writer that died there left behind (temporary files, hidden old
  // versions): the lock proves no other writer is at work. `trainer` must outlive this.
  // Every file, listing, removal and timing here, the writer thread's included, goes
  // through trainer.env(): one Env for the run, so that the time limit and the save
  // estimates it reads from here run on one clock.
  explicit RunDirectory(Trainer& trainer, std::optional<RunDirLock> lock = std::nullopt,
                        RunDirRole role = RunDirRole::Owner);
  // Waits for the saves in flight (their errors, if any, are lost: call flush() or fit()).
  ~RunDirectory() override;
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // trainer.fit(stop, this): checkpoints and metrics here, every save complete on return.
  FitResult fit(const StopPlan& stop = {});

  const std::string& dir() const;
  std::string path(const std::string& file) const;  // dir()/file
  // The saves this object made, oldest first.
  std::vector<SaveRecord> saves() const;
  // Where every save goes: dir(), then each of checkpoint.replicas (docs/recovery.md).
  std::vector<std::string> tiers() const;
  // After a survey of the tiers (survey_run) and the restore from its chosen copy: every
  // tier whose lock this holds gets each checkpoint file that is missing there, damaged,
  // or older than the reference copy rewritten from it (last.h5's reference is the copy
  // resumed from; another file's, its newest sound copy). Another run's files are left to
  // this run's next save. One line per file: "repaired runs/x/last.h5 (damaged: checksum
  // mismatch ...) from runs/x/epoch_0002.h5", or a warning when it cannot be rewritten.
  // Call before fit(), on the thread that runs it.
  std::vector<std::string> repair(const RunSurvey& survey);
  // The memory tier (checkpoint.memory_tier; docs/recovery.md, "The memory tier"): from
  // here on keep_step() copies the state after every step into the run's slot file in
  // `dir`, and fit() removes the file when it returns (the run ended, or a signal or a
  // limit stopped it); a throw or a kill leaves it for the relaunch. A file that cannot
  // be written is reported once and training goes on without it. The state's tensors
  // must be on the CPU. Call before fit(), on the thread that runs it.
  void keep_memory_tier(const std::string& dir);
  // The slot file in use ("" when none).
  std::string memory_tier_file() const;
  // The same for a state received from another rank (checkpoint.peer_replica): `bytes`,
  // a sound checkpoint at `global_step` that `source` names, rewrites last.h5 in every
  // tier (of `survey`) where it is missing, damaged or older.
  std::vector<std::string> repair_from(const std::string& bytes, int64_t global_step, const std::string& source,
                                       const RunSurvey& survey);

  // RunSink.
  void save(Trainer& trainer, CheckpointKind kind) override;
  void record_metrics(Trainer& trainer, const std::optional<EvalResult>& test) override;
  void after_step(Trainer& trainer) override;
  void keep_step(Trainer& trainer) override;
  // Appends to step_digests.jsonl (opened at the first call, cut after the step before
  // the first record: a resumed run's steps replace what a killed one wrote after its
  // checkpoint).
  void record_step_digests(Trainer& trainer, const std::vector<StepDigest>& steps) override;
  double save_estimate(const Trainer& trainer) const override;
  void flush(Trainer& trainer) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace engine
