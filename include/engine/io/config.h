// The training configuration: a JSON file (configs/mnist.json), validated key by key
// (docs/config.md), with dotted-key overrides from the command line.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/kernels/tree_chunks.h"

namespace engine {

// The config's fixed choices, as the code uses them. JSON files, --set and checkpoints
// spell them as to_string() does (docs/config.md); config_from_json turns the strings
// into these, and config_to_json back.
enum class OptimizerName { AdamW, Adam };        // "adamw" (decoupled weight decay) | "adam" (L2)
enum class SchedulerName { Cosine, Constant };   // "cosine" | "constant"
enum class PrecisionMode { Fp32, Fp16 };         // "fp32" | "fp16"
enum class MonitorMetric { ValLoss, ValAcc };    // "val_loss" (lower is better) | "val_acc" (higher)
enum class SaveErrorPolicy { Stop, Continue };   // "stop" | "continue"
enum class DistBackend { Auto, Mpi, Nccl };      // "auto" | "mpi" | "nccl" (docs/distributed.md)

const char* to_string(OptimizerName v);
const char* to_string(SchedulerName v);
const char* to_string(PrecisionMode v);
const char* to_string(MonitorMetric v);
const char* to_string(SaveErrorPolicy v);
const char* to_string(DistBackend v);

struct DataConfig {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int batch_size = 128;
  int val_split = 5000;                    // images held out of the training set
  std::optional<int64_t> train_limit;      // null = all (after the validation split)
  std::optional<int64_t> test_limit;       // null = all
  double mean = 0.2860;
  double std = 0.3530;
};

struct ModelConfig {
  // A name the model factory knows: the CLI checks it against the registry
  // (engine/nn/models/registry.h, model_names()) with require_choice; a host may bring more.
  std::string name = "fashion_cnn";
  double dropout = 0.25;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::AdamW;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct SchedulerConfig {
  SchedulerName name = SchedulerName::Cosine;
  std::optional<int64_t> t_max;  // null = train.epochs
  double eta_min = 0.0;
};

struct LossScaleConfig {
  double init = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct PrecisionConfig {
  PrecisionMode mode = PrecisionMode::Fp32;
  LossScaleConfig loss_scale;
};

struct EarlyStoppingConfig {
  MonitorMetric monitor = MonitorMetric::ValLoss;
  int64_t patience = 5;              // 0 disables early stopping
  double min_delta = 1e-4;
};

struct TrainConfig {
  int64_t epochs = 15;
  EarlyStoppingConfig early_stopping;
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
};

struct LoggingConfig {
  bool tensorboard = true;  // RUN_DIR/tensorboard/events.out.tfevents.* each epoch
};

struct CudaConfig {
  bool deterministic = true;  // restrict cuDNN to deterministic algorithms
  // Compute by the fixed chunks of the batch, dist.chunks (the same bits at any world size); false:
  // whole-batch calls, faster, one process only (docs/distributed.md, "GPU ranks").
  bool batch_chunks = false;
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

struct Config {
  uint64_t seed = 0;
  std::string device = "auto";  // "auto" | "cpu" | "cuda" | "cuda:N"
  DataConfig data;
  ModelConfig model;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  PrecisionConfig precision;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  CudaConfig cuda;
  DistConfig dist;

  int64_t effective_t_max() const { return scheduler.t_max ? *scheduler.t_max : train.epochs; }
};

// Errors in a config carry one line naming the file (or "--set") and the dotted key.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses and validates. `origin` names the source in error messages (a path).
// Unknown keys are errors that name the closest valid key; missing keys take defaults.
Config config_from_json(const nlohmann::json& j, const std::string& origin);
Config load_config(const std::string& path);
// Applies "dotted.key=value" overrides to the JSON before validation. The value is
// parsed as JSON when it can be (3, 1e-3, true, null, [0.9,0.99], "x"), else taken as a
// string. An unknown key is a ConfigError naming the closest valid key.
void apply_override(nlohmann::json& j, const std::string& assignment);
// Throws the ConfigError a fixed choice gives ("<origin>: key 'model.name' must be one
// of fashion_cnn, mlp, got \"x\"") unless `value` is one of `choices`: for choices the
// config layer cannot know itself, such as model.name against the model registry.
void require_choice(const std::string& origin, const std::string& key, const std::string& value,
                    const std::vector<std::string>& choices);
// The complete resolved config (every key, defaults filled in), e.g. for checkpoints.
nlohmann::json config_to_json(const Config& c);
// The defaults as JSON (the schema of valid keys).
nlohmann::json default_config_json();

// One entry per config key, in file order, as docs/config.md's key tables state them:
// the dotted name, the type ("integer, nullable", ...), the accepted range in the
// documentation's words, and the default value as JSON text.
struct ConfigKeyInfo {
  std::string dotted, type, range, default_json;
};
std::vector<ConfigKeyInfo> config_keys();

}  // namespace engine
