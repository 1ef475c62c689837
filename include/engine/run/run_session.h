// A training run as one process of a job: what `engine train` does with one rank or
// several (docs/distributed.md), for a host of its own. Under mpirun/srun every rank
// builds the same session; without a launcher it is the only process of a job of one.
//
//   engine::RunSession session(cfg, {/*quiet_other_ranks=*/true});  // job; rank 0: lock
//   engine::Trainer& t = session.start(engine::make_model(cfg), &observer);
//   engine::RunBegin b = session.begin();       // recovery: resume from the newest sound state
//   for (auto& line : b.messages) std::cout << line << "\n";
//   if (b.outcome != engine::RunBegin::Outcome::AlreadyComplete)
//     engine::FitResult r = session.fit(stop);  // rank 0 writes <run-dir>, the others nothing
//
// What it owns, and in which order it lets go: the job's collective (shared with this
// process's job, below, so that it outlives the session), <run-dir>'s lock and then its
// RunDirectory (rank 0 only), and the Trainer. A rank other than 0 never creates,
// locks or writes anything in <run-dir>.
//
// A rank that fails alone (its data missing, a disk error, any exception) must end the
// whole job, or the others wait for it in their next collective until dist.timeout_s:
//
//   catch (const std::exception& e) {
//     std::cerr << "host: " + engine::RunSession::rank_tag() + e.what() + "\n";
//     engine::RunSession::abort_job(1);   // every rank exits with 1
//   }
//
// That works after the session is gone too (an exception unwinds it before main's catch
// runs): the job outlives it, to the end of the process.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/collective.h"
#include "engine/train/config.h"
#include "engine/io/dataset.h"
#include "engine/core/device.h"
#include "engine/io/env.h"
#include "engine/nn/model.h"
#include "engine/run/recovery.h"
#include "engine/train/start_agreement.h"
#include "engine/train/trainer.h"

namespace engine {

class RunDirectory;

// How RunSession::begin starts a run.
enum class StartFrom {
  Newest,   // the newest sound checkpoint of this run in any tier (docs/recovery.md), else fresh
  Scratch,  // fresh: the previous run's files in every tier moved aside first (--fresh)
};

struct BeginOptions {
  StartFrom from = StartFrom::Newest;
  // A run whose epochs are all trained and whose test result is recorded is
  // AlreadyComplete unless this is set (then fit() evaluates the test set again).
  bool reevaluate = false;
};

// What RunSession::begin did.
struct RunBegin {
  enum class Outcome { Fresh, Resumed, AlreadyComplete } outcome = Outcome::Fresh;
  std::string checkpoint;  // the file resumed from ("" when fresh)
  StateReport load_report;
  // Several ranks: the start agreement (engine/train/start_agreement.h).
  std::optional<StartAgreement> agreement;
  // Rank 0: every tier's checkpoints as found (empty on other ranks and with Scratch).
  RunSurvey survey;
  // Rank 0: what to tell the user, one line each, in order: the files moved aside
  // (Scratch), "resuming from epoch E, step S of epoch E+1 (FILE)" with the copies
  // skipped and why, the repairs, "already complete: ...". Warnings start "warning: ".
  std::vector<std::string> messages;
  // The memory tier's slot file that was read (docs/recovery.md); "" when the tier is off.
  std::string memory_tier_file;
  // Where begin() spent its time, seconds: the survey of every tier (loading each copy),
  // restoring the chosen state, and the repairs (docs/recovery.md, "Relaunch time").
  struct Seconds {
    double survey = 0, restore = 0, repair = 0;
  } seconds;
};

struct RunSessionOptions {
  // Ranks other than 0 send their stdout to /dev/null (what the CLI does: only rank 0
  // prints). stderr is always kept, so errors and warnings reach the launcher from every
  // rank; prefix them with rank_tag().
  bool quiet_other_ranks = false;
  // The run's file system and clocks (engine/io/env.h; null: Env::posix()): the run
  // directory, its lock, its checkpoints and metrics, the time limit. Given to the
  // Trainer; it must outlive the session.
  Env* env = nullptr;
};

class RunSession {
 public:
  // Joins the job this process was launched into (detect_launch(): mpirun, srun, PMI;
  // none: a job of one process that makes no MPI call), with a collective for
  // cfg.dist.backend on resolve_device(cfg.device) and cfg.dist.timeout_s as its
  // watchdog. Call before any CUDA work (NCCL picks this rank's GPU). Rank 0 then
  // creates cfg.checkpoint.dir when absent and takes its lock, before any data is
  // loaded, so a second writer is refused at once. Throws (one line each):
  // std::runtime_error for a launch this build cannot join ("started by mpirun as rank
  // 1 of 2, but this engine was built without MPI ..."), for "<dir>: cannot create the
  // run directory: ..." and for "cannot silence stdout"; RunDirBusy naming the holder of
  // the lock; std::invalid_argument for a dist.backend the device or build cannot have,
  // or a dist.timeout_s <= 0.
  explicit RunSession(Config cfg, const RunSessionOptions& options = {});
  ~RunSession();
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;

  // ---- the job ----
  int rank() const;
  int size() const;
  // Rank 0 (or the only process): it alone holds the lock and the RunDirectory.
  bool writes_run_dir() const { return rank() == 0; }
  // The exchanges between the ranks ("single" or "mpi", "nccl" ...: collective().name()).
  // The trainer uses it; it lives as long as the process's job (below).
  Collective& collective() const;
  const Config& config() const;
  Device device() const;

  // ---- the run ----
  // Builds this rank's Trainer (the same state on every rank; rank r trains its chunks of
  // each batch through collective()), and on rank 0 the RunDirectory over it, which takes
  // the lock this session holds. Applies the config's process-wide settings first
  // (apply_process_settings: cuda.deterministic). `observer` (may be null) must outlive
  // the session; `data` as TrainerOptions::data (null: cfg.data's Fashion-MNIST).
  // Throws what the Trainer's constructor throws (DataError, ...), and
  // std::logic_error when called twice.
  Trainer& start(std::unique_ptr<Model> model, TrainerObserver* observer = nullptr,
                 std::unique_ptr<Dataset> data = nullptr);
  // After start() (std::logic_error before).
  Trainer& trainer();
  // Rank 0's run directory after start(); on the rank that keeps checkpoint.peer_replica's
  // copy, that copy's directory; null on other ranks and before start().
  RunDirectory* run_directory();

  // Before training, after start(): the ranks check that they start the same run (config,
  // build, data, and the checkpoint each is about to resume from, "" for a fresh start;
  // engine/train/start_agreement.h). Every rank returns the same agreement, or every rank
  // throws StartMismatchError with the same one-line message (then each may simply exit:
  // no rank waits on another, no abort is needed). With one rank it returns at once.
  StartAgreement agree_on_start(const std::string& checkpoint_path = "");

  // After start(), instead of agree_on_start: how `engine train` begins. Rank 0 surveys
  // every tier (survey_run: checkpoint.dir, then checkpoint.replicas) and picks the newest
  // sound checkpoint of this run by global step; every rank restores it (or starts
  // fresh when no tier holds a checkpoint at all) after the start agreement; rank 0 then
  // repairs the damaged, stale or missing copies of the tiers it holds the lock of
  // (RunDirectory::repair) and tells whether the run is already complete. Throws a
  // one-line CheckpointError, naming every file tried, when checkpoints exist but none
  // is a sound one of this run, and when the run directory holds another run's
  // checkpoint (never resumed, never overwritten); StartMismatchError as agree_on_start;
  // std::logic_error before start(). With Scratch, rank 0 first moves the run files of
  // every tier aside (move_previous_run_aside).
  RunBegin begin(const BeginOptions& options = {});
  // After start(), instead of begin(), when the caller restored the state itself (`engine
  // resume FILE.h5`): rank 0 starts the run directory's memory tier (checkpoint.memory_tier,
  // docs/recovery.md) from the restored state. The slot file of the run directory's
  // earlier steps is removed first (a relaunch must not resume from those), and so are
  // the abandoned files of the tier's directory. Returns a line for each file removed.
  std::vector<std::string> continue_from_restored();
  // Whether the trainer's run is complete: every epoch trained (or stopped early) and
  // the test result recorded in <run-dir>/metrics.jsonl.
  bool already_complete();

  // Trains: RunDirectory::fit on rank 0 (checkpoints, metrics.jsonl, TensorBoard, every
  // save on disk on return), Trainer::fit with no sink elsewhere. The ranks stop together.
  FitResult fit(const StopPlan& stop = {});

  // ---- this process's job, with or without a session ----
  // "rank 2: " when a launcher started this process as one of several ranks, "" in one
  // process: the prefix of every line a rank writes to stderr (the launcher mixes the
  // ranks' stderr). From the launcher's environment, so known before any session.
  static std::string rank_tag();
  // Ends the job at once: when a session has joined a job of several ranks, every rank
  // exits with `exit_code` (Collective::abort: MPI_Abort); otherwise this process
  // (std::exit). Flushes stdout and stderr first. For a rank that fails alone; safe
  // after the session is destroyed (the job is kept to the end of the process).
  [[noreturn]] static void abort_job(int exit_code);

 private:
  // Whether this rank keeps checkpoint.memory_tier: one process on the CPU, after start().
  bool keeps_memory_tier() const;
  // checkpoint.peer_replica: which rank keeps the copy on another host (every rank agrees).
  void choose_peer();
  RunBegin begin_with_peer(const BeginOptions& options);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace engine
