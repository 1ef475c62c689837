// The config sections the train layer reads: train, checkpoint, logging, cuda and dist
// (docs/config.md). How sections make up the config: engine/io/config_table.h.
// checkpoint and logging are read by the run directory (engine/run/) as well; they are
// declared here because the Trainer, which holds the whole Config, decides when to save
// and what a refused save does.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/config_table.h"
#include "engine/kernels/tree_chunks.h"

namespace engine {

// The fixed choices, spelled in JSON as to_string() does.
enum class MonitorMetric { ValLoss, ValAcc };    // "val_loss" (lower is better) | "val_acc" (higher)
enum class SaveErrorPolicy { Stop, Continue };   // "stop" | "continue"
enum class DistBackend { Auto, Mpi, Nccl };      // "auto" | "mpi" | "nccl" (docs/distributed.md)

const char* to_string(MonitorMetric v);
const char* to_string(SaveErrorPolicy v);
const char* to_string(DistBackend v);

struct EarlyStoppingConfig {
  MonitorMetric monitor = MonitorMetric::ValLoss;
  int64_t patience = 5;              // 0 disables early stopping
  double min_delta = 1e-4;
};

struct TrainConfig {
  int64_t epochs = 15;
  EarlyStoppingConfig early_stopping;
  bool step_digests = true;  // step_digests.jsonl (docs/replay.md)
};

struct CheckpointConfig {
  std::string dir = "runs/mnist";
  int64_t keep_last = 3;
  std::optional<int64_t> every_n_epochs = 5;  // milestone epoch_NNNN.h5; null = none
  std::optional<int64_t> every_n_steps;       // mid-epoch last.h5; null = none
  std::vector<int64_t> keep_epochs;           // milestones never rotated away
  bool verify = true;                         // reload and compare after each save
  bool async = true;                          // write saves on a writer thread (run_directory.h)
  // What training does when the disk refuses a save (CheckpointWriteError): Stop
  // (fit throws it; the CLI exits 3) or Continue (a warning; the next save retries).
  SaveErrorPolicy on_error = SaveErrorPolicy::Stop;
  // Second-tier directories: every save is also written into each (docs/recovery.md).
  std::vector<std::string> replicas;
  // Also rewrite last.h5 at the first step boundary this many seconds after the last
  // save (rank 0's clock decides for every rank); null: no saves by time.
  std::optional<double> every_seconds;
  // The k best epochs by the monitored metric, each kept as best_epoch_NNNN.h5; 0: none.
  int64_t keep_best = 0;
  // Data-parallel: the first rank on another host than rank 0 keeps a copy of every
  // save in its own (local) checkpoint.dir (docs/recovery.md).
  bool peer_replica = false;
  // The memory tier (docs/recovery.md): the directory of the slot file that keeps the
  // state after every step (shared memory, e.g. "/dev/shm"); null: not kept.
  std::optional<std::string> memory_tier;
};

struct LoggingConfig {
  bool tensorboard = true;  // RUN_DIR/tensorboard/events.out.tfevents.* each epoch
};

struct CudaConfig {
  bool deterministic = true;  // restrict cuDNN to deterministic algorithms
  // Compute by the fixed chunks of the batch, dist.chunks (the same bits at any world size); false:
  // whole-batch calls, faster, one process only (docs/distributed.md, "GPU ranks").
  bool batch_chunks = false;
  // Replay each training step as a CUDA graph (one launch a step) once its buffers are
  // sized; false: launch every op of every step.
  bool graphs = false;
};

// Data-parallel runs under mpirun/srun (docs/distributed.md); ignored in one process.
struct DistConfig {
  // Auto: NCCL for CUDA ranks, MPI for CPU ranks. Mpi / Nccl force one (NCCL needs CUDA).
  DistBackend backend = DistBackend::Auto;
  // A collective that has not completed after this many seconds means a rank has died
  // or stopped responding: the job is aborted with a message naming the rank.
  double timeout_s = 300;
  // The fixed chunks a batch is cut into (a power of two): every cross-sample sum is the
  // tree over them, so the bits depend on this and not on the ranks; any world size up
  // to it trains the same run. A property of the run: a checkpoint resumes only with
  // the value it was trained with.
  int chunks = kTreeChunks;
};

const ConfigSection<TrainConfig>& train_config_keys();
const ConfigSection<CheckpointConfig>& checkpoint_config_keys();
const ConfigSection<LoggingConfig>& logging_config_keys();
const ConfigSection<CudaConfig>& cuda_config_keys();
const ConfigSection<DistConfig>& dist_config_keys();

}  // namespace engine
