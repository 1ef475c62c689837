// The public training API: everything the `engine` CLI does is a call here, so the
// library can be embedded (docs/embedding.md). A Trainer owns the model it is given,
// the dataset, optimizer, scheduler, loss scaler, RNG, counters and metrics history,
// all exposed through the uniform state interface, and snapshots/restores all of it
// plus any state groups the host registers. It writes no file of its own: fit() hands
// its checkpoints and metrics to a RunSink (engine/run/run_directory.h keeps a run
// directory), and save_checkpoint() writes one file when a host asks.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/collective.h"
#include "engine/io/dataset.h"
#include "engine/nn/optimizer.h"
#include "engine/core/parameter_shards.h"
#include "engine/core/rng.h"
#include "engine/nn/scaler.h"
#include "engine/nn/scheduler.h"
#include "engine/io/checkpoint.h"
#include "engine/train/config.h"
#include "engine/nn/model.h"
#include "engine/io/env.h"
#include "engine/io/step_digest.h"
#include "engine/train/epoch_metrics.h"
#include "engine/train/run_control.h"

namespace engine {

// Several ranks: after a step, the state every rank holds as a replica (the whole
// parameters after the allgather, the batch norms' statistics, the RNG and data
// positions, the step's losses) differs between them (docs/replay.md). Thrown on every
// rank at that step, before anything of it is saved.
struct ReplicaDivergence : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What one train_step() did.
struct StepResult {
  int64_t epoch = 0;          // 1-based epoch the step belonged to
  int64_t step_in_epoch = 0;  // steps done in that epoch, this one included
  int64_t global_step = 0;
  double loss = 0;            // mean train loss of the step's batch
  // Set when the step completed its epoch: validation ran, the scheduler stepped, and
  // the epoch is in history() (what fit() does at an epoch end, without checkpoints).
  std::optional<EpochMetrics> epoch_end;
};

struct Progress {
  int64_t epoch = 0, epochs = 0;  // 1-based current epoch, total
  int64_t step = 0, steps = 0;    // batches done in this epoch, batches per epoch
  double running_loss = 0;        // mean train loss over this epoch so far
  double samples_per_second = 0;
  double eta_seconds = 0;
};

// KeepBest: one of the checkpoint.keep_best best epochs (best_epoch_NNNN.h5).
enum class CheckpointKind { Last, Best, Milestone, MidEpoch, KeepBest };
const char* checkpoint_kind_name(CheckpointKind k);

// The epochs of the `k` best entries of `history` by `monitor` (lower val_loss or higher
// val_acc first; of equal values the earlier epoch), best first: checkpoint.keep_best.
std::vector<int64_t> best_epochs(const std::vector<EpochMetrics>& history, MonitorMetric monitor, int64_t k);

// Receives what the trainer has to say; the CLI prints it. All methods optional.
class TrainerObserver {
 public:
  virtual ~TrainerObserver() = default;
  virtual void on_message(const std::string&) {}
  virtual void on_epoch_begin(int64_t /*epoch*/, int64_t /*epochs*/, int64_t /*steps*/) {}
  virtual void on_progress(const Progress&) {}  // throttled to a few per second
  // After every optimizer step (and after the mid-epoch checkpoint fit() writes at it).
  virtual void on_step_end(int64_t /*global_step*/) {}
  virtual void on_epoch_end(const EpochMetrics&) {}
  virtual void on_checkpoint(const std::string& /*path*/, CheckpointKind) {}
};

enum class LoadMode { Strict, NonStrict };

// Told by Trainer::restore of each group it has loaded, in order. An observer that
// throws acts as a component failing after it changed its state: restore rolls every
// component it touched back and rethrows.
class RestoreObserver {
 public:
  virtual ~RestoreObserver() = default;
  virtual void after_group(const std::string& group) = 0;
};

// Deliberate interruptions, for time-limited jobs.
struct StopPlan {
  std::optional<int64_t> after_epochs;  // stop cleanly after this many epochs in total
  // Stop cleanly, last.h5 saved, before this much wall-clock time has passed since
  // time_limit_from (default: when fit() starts); the next step, evaluation and save
  // are estimated from those measured so far, and a margin is kept. Measured with the
  // trainer's Env (Env::monotonic_now), which time_limit_from is a time of.
  std::optional<double> time_limit_seconds;
  std::optional<std::chrono::steady_clock::time_point> time_limit_from;
};

struct FitResult {
  enum class Ending { Completed, EarlyStopped, Stopped } ending = Ending::Completed;
  // Why a Stopped run stopped: a stop request (RunControl), StopPlan::after_epochs, or
  // StopPlan::time_limit_seconds.
  enum class StopCause { None, Requested, EpochLimit, TimeLimit } stop_cause = StopCause::None;
  int64_t epochs_done = 0;
  std::optional<EvalResult> test;  // evaluated on the test set when training completed
};

class TimeBudget;
class RunProtocol;
class BatchChunks;
class StepValues;
class StepGraphs;
class Trainer;

// Where fit() keeps its run: the checkpoints at the points the loop chooses and the
// metrics after each epoch. engine/run/run_directory.h implements it for <run-dir>; without
// one, fit() writes nothing (a data-parallel rank other than 0, a host that saves itself).
// Every method is called on the thread that runs fit().
class RunSink {
 public:
  virtual ~RunSink() = default;
  // A checkpoint of the trainer's state as it is now. May return once the state is
  // copied and write it later; throws CheckpointWriteError when the run must stop
  // (checkpoint.on_error = stop), for this save's failure or an earlier one's.
  virtual void save(Trainer& trainer, CheckpointKind kind) = 0;
  // The history has a new epoch, or (with `test`) training is complete.
  virtual void record_metrics(Trainer& trainer, const std::optional<EvalResult>& test) = 0;
  // After every optimizer step: surfaces (throws, or warns) a failure of a save written
  // in the background meanwhile.
  virtual void after_step(Trainer&) {}
  // After every step whose state a checkpoint could hold (an epoch's last step once its
  // end is done): the memory tier keeps it (docs/recovery.md, "The memory tier").
  virtual void keep_step(Trainer&) {}
  // The step digests of the steps trained since the last call, in order
  // (train.step_digests; docs/replay.md): every step's before any save of it.
  virtual void record_step_digests(Trainer&, const std::vector<StepDigest>&) {}
  // Seconds from requesting a save until it is complete, as the time limit must assume.
  virtual double save_estimate(const Trainer& trainer) const = 0;
  // Every save requested is complete when this returns (fit() calls it before it returns
  // or throws, and after a checkpoint request); throws like save().
  virtual void flush(Trainer& trainer) = 0;
};

// What a Trainer needs besides its config, device and model; every field may stay at its
// default (Trainer t(cfg, device, make_model(cfg)) takes them all). As with LevelDB's
// Options::env, the host sets the fields it needs on a named TrainerOptions and hands it
// to the constructor.
struct TrainerOptions {
  // Hears what the trainer has to say (null: nothing is reported). Must outlive the
  // trainer.
  TrainerObserver* observer = nullptr;
  // The splits the constructor loads onto the device, so that missing files fail there:
  // All, or TestOnly for a trainer that only evaluates (train_step() refuses).
  SplitsNeeded splits = SplitsNeeded::All;
  // The data, owned by the trainer from then on; its splits must be on the trainer's
  // device, and its images and classes must match the model's. Null:
  // make_dataset(cfg.data, device).
  std::unique_ptr<Dataset> data;
  // Data-parallel (docs/distributed.md): with W ranks (W <= dist.chunks),
  // data.batch_size is the global batch; each rank computes its chunks of every batch
  // and the ranks complete the sums in a fixed order, so every rank holds the state of
  // the one-process run, bit for bit. Null: one process. Must outlive the trainer.
  Collective* collective = nullptr;
  // The run's file system and clocks (engine/io/env.h): the checkpoints resume_from()
  // and save_checkpoint() read and write, the clock of the time limit and of the epoch
  // timings, and everything a RunDirectory over this trainer does (the dataset reads its
  // own files). Null: Env::posix(). Must outlive the trainer.
  Env* env = nullptr;
};

class Trainer {
 public:
  // Trains `model` (e.g. make_model(cfg) from engine/train/model_factory.h, or a host's
  // own) on options.data, or on cfg.data's data set. The trainer moves the model to
  // `device` and initialises its parameters from the seed; the model's input shape and
  // classes must match the dataset's.
  Trainer(Config cfg, Device device, std::unique_ptr<Model> model, TrainerOptions options = {});
  ~Trainer();

  const Config& config() const { return cfg_; }
  Device device() const { return device_; }
  Env& env() const { return env_; }
  Model& model() { return *model_; }
  Dataset& dataset() { return *data_; }
  TrainerObserver& observer() { return *observer_; }
  // Stop and checkpoint requests for this trainer's runs (async-signal-safe; the CLI's
  // SIGINT/SIGTERM/SIGUSR1 handlers reach it through an atomic pointer).
  RunControl& control() { return control_; }

  // Runs the remaining epochs from the current state, handing checkpoints and metrics
  // to `sink` (RunDirectory::fit passes itself; null: nothing is written). Before it
  // returns, or throws, sink->flush() has completed every save requested.
  FitResult fit(const StopPlan& stop = {}, RunSink* sink = nullptr);

  // A host's own loop. train_step() runs one optimizer step of the current epoch
  // (shuffling when the epoch begins; at its last step, the end-of-epoch work of
  // fit(): validation, scheduler step, metrics history, early-stopping bookkeeping).
  // train_epoch() runs the steps left in the current epoch the same way. Both give the
  // same bits as fit() and can be mixed with it, but write no file: no checkpoint, no
  // metrics.jsonl (call save_checkpoint). Both throw std::logic_error once train.epochs
  // epochs are done.
  StepResult train_step();
  EpochMetrics train_epoch();
  // True when early stopping's patience has run out (fit() would stop here).
  bool early_stop_reached() const;

  // The whole state (snapshot()) written atomically to `path`, and reloaded and
  // compared when checkpoint.verify is on (verify_saved_checkpoint).
  void save_checkpoint(const std::string& path);

  // Registers a host component's state as the checkpoint group `name` (letters, digits,
  // '_', '-', '.'; not a built-in group's name). From then on every checkpoint holds it
  // and restore() checks and loads it like the built-in groups: in a checkpoint without
  // it, its keys are reported missing (Strict refuses, NonStrict leaves it unchanged).
  // `component` must outlive the trainer. Throws std::invalid_argument.
  void add_state_group(const std::string& name, Stateful* component);
  EvalResult evaluate(Split split);
  // Logits of the first `n` images of a split in eval mode (for interop and verification).
  Tensor logits(Split split, int64_t n);

  // The whole training state as a checkpoint, and back. restore() checks every group
  // first and changes nothing unless it can apply all of it (Strict) or everything
  // that matches (NonStrict); the report lists what was missing/unexpected/mismatched.
  // Should a component still fail while loading, every component touched, the failing
  // one included, is rolled back. The config decides whether loss scaling is on (the
  // saved scale continues when the checkpoint was scaling too). The data set may change
  // size at an epoch boundary, not mid-epoch (the position in the shuffled epoch
  // depends on it).
  Checkpoint snapshot() const;
  // The bytes of the tensors snapshot() holds (with several ranks, of the whole state a
  // save writes, while each rank holds only its shard of the optimizer's moments).
  int64_t state_bytes() const;
  // The bytes of optimizer moments this rank holds now: about 1/W of them while a fit()
  // or a step runs on W CPU ranks (ZeRO-1), all of them otherwise.
  int64_t optimizer_moment_bytes() const { return optimizer_->moment_bytes(); }
  StateReport restore(const Checkpoint& ckpt, LoadMode mode, RestoreObserver* observer = nullptr);
  // load_checkpoint + restore; throws CheckpointError naming the file on failure.
  StateReport resume_from(const std::string& path, LoadMode mode);

  // The digest of the state after the last step (docs/replay.md): recorded by the step
  // itself with train.step_digests, computed from the state otherwise (and after a
  // restore, the checkpoint's). What every checkpoint stores as trainer/step_digest.
  uint64_t step_digest() const;
  // The last step's full record, when train.step_digests recorded it (nothing before the
  // first step of this process, or when off).
  const std::optional<StepDigest>& last_step_digest() const {
    drain_step_digests();
    return last_digest_;
  }

  int64_t epochs_done() const { return epoch_; }
  int64_t global_step() const { return global_step_; }
  int64_t step_in_epoch() const { return step_in_epoch_; }
  double current_lr() const { return scheduler_->lr(); }
  const std::vector<EpochMetrics>& history() const { return history_; }
  // The one precision rule (engine::compute_precision, engine/nn/config_sections.h):
  // fp16 or bf16 conv/GEMM math on CUDA when precision.mode says so, fp32 otherwise (the
  // CPU backend is fp32). Every model instance that must compute the same bits as the
  // trained one (verification, evaluation) is set to this.
  Precision compute_precision() const;

 private:
  class CounterState;
  class MetricsState;
  enum class Interruptible { No, Yes };  // may a stop request cut validation short?
  void train_epoch(bool& interrupted);
  // Shuffles when the epoch begins and derives its permutation (once per epoch).
  void prepare_epoch();
  int64_t steps_per_epoch();
  // One optimizer step on batch step_in_epoch_ of the current epoch.
  void run_step();
  // Validation, scheduler, history, early stopping: whether the metric improved, or
  // nothing (and no change) when a stop request cut the validation short.
  std::optional<bool> finish_epoch(double seconds, EpochMetrics& m, Interruptible when);
  void require_epochs_left() const;
  void end_epoch(double seconds, bool& stop_early, bool& interrupted);
  // evaluate(), but gives up (nothing) between batches once a stop is requested.
  std::optional<EvalResult> evaluate_unless_stopped(Split split);
  std::optional<EvalResult> evaluate_impl(Split split, const RunControl* stop);
  // Time-limit check (run_control): true when the work ahead would overrun.
  bool out_of_time(bool last_step_of_epoch);
  // Calls the sink through the run protocol: with several ranks, rank 0 holds a failure
  // until the next agreement instead of throwing alone while the others wait.
  template <class SinkCall>
  void call_sink(SinkCall&& call);
  std::string time_limit_message() const;
  // Hands the state to the run's sink (nothing without one).
  void save(CheckpointKind kind);
  // checkpoint.every_seconds: whether that long has passed since the last save (asked
  // on the rank whose clock decides).
  bool save_by_time_due();
  void record_metrics(const std::optional<EvalResult>& test);
  double save_estimate() const;
  FitResult fit_loop(const StopPlan& stop);
  // Several CPU ranks: the optimizer's moments whole again (a collective; every rank at
  // the same point: a save, the end of fit() or of train_step()).
  void gather_optimizer_shards();
  // Every rank's per-sample values of a batch (this rank filled its own), on the
  // training device.
  void gather_samples(const BatchChunks& plan, float* values) const;
  // The first n images of a split, normalised, on the training device: [n, C, H, W].
  Tensor first_images(Split split, int64_t n);
  Shape batch_shape(int64_t n) const;
  // The groups of every checkpoint: the built-in ones, then the host's.
  std::vector<std::pair<std::string, Stateful*>> builtin_components();
  std::vector<std::pair<std::string, Stateful*>> components();

  const Config cfg_;
  const std::string config_json_;  // cfg_ resolved, as every checkpoint stores it (made once)
  Device device_;
  Env& env_;
  TrainerObserver* observer_;
  TrainerObserver silent_;
  std::unique_ptr<Dataset> data_;
  Rng rng_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamOptimizer> optimizer_;
  std::unique_ptr<LrScheduler> scheduler_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<CounterState> counter_state_;
  std::unique_ptr<MetricsState> metrics_state_;
  std::vector<std::pair<std::string, Stateful*>> host_groups_;

  // Run control: requests from outside, where the run goes, the deadline.
  RunControl control_;
  RunSink* sink_ = nullptr;                  // set while a fit() runs
  std::unique_ptr<TimeBudget> time_budget_;  // set while a fit() with a time limit runs
  FitResult::StopCause stop_cause_ = FitResult::StopCause::None;
  // The agreements between the ranks, rank 0's clock, held sink failures: one process
  // or several (engine/train/run_protocol.h).
  std::unique_ptr<RunProtocol> protocol_;

  // Counters and early-stopping state (saved in the "trainer" group).
  int64_t epoch_ = 0, global_step_ = 0, step_in_epoch_ = 0;
  uint64_t epoch_shuffle_offset_ = 0;
  double best_metric_;
  int64_t best_epoch_ = 0, epochs_without_improvement_ = 0;
  Tensor epoch_sample_loss_;  // per-sample train losses of the current epoch
  std::vector<EpochMetrics> history_;

  // The epoch whose permutation_ is derived (its shuffle offset), and when it began.
  std::optional<uint64_t> permutation_offset_;
  std::chrono::steady_clock::time_point epoch_clock_;
  // When fit() began or last handed a save to its sink (checkpoint.every_seconds).
  std::chrono::steady_clock::time_point last_save_at_;
  // Seconds the current epoch trained in earlier sessions (before a mid-epoch resume),
  // saved as trainer/epoch_elapsed_seconds so that epoch_seconds counts the whole epoch.
  double epoch_elapsed_before_ = 0;
  // This epoch's training seconds so far, all sessions (0 at an epoch boundary).
  double epoch_elapsed_seconds() const;

  // The ranks of a data-parallel run (collective_ points at single_process_ in one process).
  SingleProcessCollective single_process_;
  Collective* collective_ = &single_process_;

  // Several CPU ranks: each owns a shard of the flat parameters and of the optimizer's
  // moments (docs/distributed.md "Sharded optimizer"); the layers leave their weight and
  // bias block sums in grad_parts_ for one pass after backward.
  std::unique_ptr<ParameterShards> shards_;
  GradientParts grad_parts_;
  std::vector<Tensor*> param_values_, param_grads_;

  // The values that change from one step to the next, in device memory (one upload a step).
  std::unique_ptr<StepValues> step_values_;
  // CUDA graphs of the step, by batch size (cuda.graphs); dropped by drop_step_graphs().
  std::unique_ptr<StepGraphs> step_graphs_;
  void drop_step_graphs();
  // Whether this run's steps may be captured (cuda.graphs, and a step that reads nothing
  // back to the host and allocates nothing: CUDA, whole batches, one process, no scaler).
  bool step_graphs_apply() const;
  // The step's device work, from the gather to the optimizer: what a graph captures.
  void step_device_work(const BatchChunks& plan, int batch_total, int local);
  // Step digests (train.step_digests; docs/replay.md). The optimizer adds its tensors'
  // digests to digest_sums_ as it updates; the step's one more launch
  // (tt::step_digest_finish) moves them, with the batch norms' statistics' and the
  // losses', into a row of digest_ring_. The host keeps each step's own part (counters,
  // RNG, data position) until the rows are read: after every step on the CPU, at saves
  // and epoch ends on a GPU (no wait in the step).
  struct DigestHostPart {
    int64_t global_step, epoch, step_in_epoch;
    uint64_t shuffle_offset;
    std::vector<std::pair<std::string, uint64_t>> rng;
  };
  bool step_digests_on() const;
  void prepare_step_digests();
  void finish_step_digests(int batch_total);  // in the step's device work (a graph records it)
  void record_step_digest();                  // after the step: the host's part
  void drain_step_digests() const;            // the rows read: records made
  void hand_step_digests();                   // drained, and the records to the sink
  // Several ranks: the digest of what every rank holds alike, and the record completed
  // with the moments' parts added up over the ranks (throws ReplicaDivergence).
  uint64_t replica_digest() const;
  void complete_step_digest(const std::vector<uint64_t>& parts, const std::vector<uint64_t>& replicas);
  Tensor digest_sums_, digest_ring_, digest_next_, digest_ranges_, digest_whole_;
  std::vector<std::string> digest_buffer_names_;
  int digest_capacity_ = 0;
  int64_t digest_loss_first_ = 0;  // the CPU's loss_first (the batch's first sample in the epoch)
  mutable int64_t digest_rows_read_ = 0;
  mutable std::vector<DigestHostPart> digest_host_;
  mutable std::vector<uint64_t> digest_parts_;  // several ranks: this rank's moment sums, 2 per parameter
  mutable bool digest_awaits_ranks_ = false;
  mutable std::optional<StepDigest> last_digest_;
  mutable std::vector<StepDigest> pending_digests_;
  std::optional<std::pair<int64_t, uint64_t>> restored_digest_;
  // Workspaces. sample_correct_: the epoch's, as epoch_sample_loss_ (unread).
  Tensor batch_x_, batch_labels_, permutation_, sample_correct_, eval_loss_, eval_correct_;
  Tensor dlogits_;
};

}  // namespace engine
