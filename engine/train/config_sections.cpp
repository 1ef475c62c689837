#include "engine/train/config_sections.h"

#include "io/config_keys.h"

namespace engine {

const char* to_string(MonitorMetric v) { return v == MonitorMetric::ValLoss ? "val_loss" : "val_acc"; }
const char* to_string(SaveErrorPolicy v) { return v == SaveErrorPolicy::Stop ? "stop" : "continue"; }
const char* to_string(DistBackend v) {
  switch (v) {
    case DistBackend::Auto: return "auto";
    case DistBackend::Mpi: return "mpi";
    case DistBackend::Nccl: return "nccl";
  }
  return "auto";
}

const ConfigSection<TrainConfig>& train_config_keys() {
  using S = TrainConfig;
  using E = EarlyStoppingConfig;
  static const ConfigSection<E> early_stopping = {
      choice_key("monitor", &E::monitor, {MonitorMetric::ValLoss, MonitorMetric::ValAcc}, "`val_loss`, `val_acc`",
          R"doc(The validation metric that early stopping watches and that selects `best.h5`. Lower is better for `val_loss`; higher is better for `val_acc`.)doc"),
      integer_key("patience", &E::patience, 0, kConfigInt64Max, "≥ 0",
          R"doc(Stop after this many epochs without improvement. `0` disables early stopping.)doc"),
      real_key("min_delta", &E::min_delta, [](double v) { return v >= 0; }, "must be >= 0", "≥ 0",
          R"doc(The smallest change of the monitored metric that counts as an improvement.)doc"),
  };
  static const ConfigSection<S> keys = [] {
    ConfigSection<S> k = {integer_key("epochs", &S::epochs, 1, kConfigInt64Max, "≥ 1",
          R"doc(Maximum number of epochs. Early stopping may end training sooner.)doc")};
    nest(k, "early_stopping", &S::early_stopping, early_stopping);
    k.push_back(boolean_key("step_digests", &S::step_digests,
          R"doc(Record a digest of every step's state in the run directory's `step_digests.jsonl` (computed in the optimizer's update, about 0.2 % of a CPU step), for `engine bisect` and `engine replay --check` (docs/replay.md). Every checkpoint carries its own step's digest either way. `false` only for measuring what they cost.)doc"));
    return k;
  }();
  return keys;
}

const ConfigSection<CheckpointConfig>& checkpoint_config_keys() {
  using S = CheckpointConfig;
  static const ConfigSection<S> keys = {
      nonempty_string_key("dir", &S::dir, "non-empty",
          R"doc(The run directory. It is created if needed.)doc"),
      integer_key("keep_last", &S::keep_last, 1, kConfigInt64Max, "≥ 1",
          R"doc(How many `epoch_NNNN.h5` milestones to keep. Older ones are deleted, except those in `keep_epochs`.)doc"),
      nullable_integer_key("every_n_epochs", &S::every_n_epochs, 1, "≥ 1",
          R"doc(Write `epoch_NNNN.h5` after every N-th epoch. `null` writes no milestones.)doc"),
      nullable_integer_key("every_n_steps", &S::every_n_steps, 1, "≥ 1",
          R"doc(Also rewrite `last.h5` every N training steps within an epoch, so an interrupted epoch can resume mid-way. `null` saves only at epoch ends.)doc"),
      {"keep_epochs", "array of integers", "each ≥ 1",
       R"doc(Epochs that always get a milestone, which rotation never deletes, e.g. `[5, 10]`.)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         const nlohmann::json* keep = r.find(dotted);
         if (!keep) return;
         if (!keep->is_array()) r.fail(dotted, "must be an array of epoch numbers, got " + describe_json(*keep));
         s.keep_epochs.clear();
         for (size_t i = 0; i < keep->size(); ++i)
           s.keep_epochs.push_back(
               r.integer_value(dotted + "[" + std::to_string(i) + "]", (*keep)[i], 1, kConfigInt64Max));
       },
       [](const S& s) { return nlohmann::json(s.keep_epochs); }},
      boolean_key("verify", &S::verify,
          R"doc(After each save, reload the file and compare it with the in-memory state. A write that is silently wrong is caught at once.)doc"),
      boolean_key("async", &S::async,
          R"doc(Write each checkpoint on a writer thread: training waits only while the state is copied into a snapshot buffer (and for the previous save, should it still be in flight); on CUDA it only queues those copies on the compute stream, and the writer thread waits for them. Every save is written; a failed one is reported at the next step or when training ends, under `checkpoint.on_error`. `false`: the training thread writes and verifies each save itself.)doc"),
      choice_key("on_error", &S::on_error, {SaveErrorPolicy::Stop, SaveErrorPolicy::Continue}, "`stop`, `continue`",
          R"doc(What training does when the disk refuses a save (full, I/O error, quota, file size limit; the previous checkpoint is left intact either way): `"stop"` ends the run at once (`engine train` exits with status 3; the same command resumes once the disk has room), `"continue"` prints a warning and goes on, and the next save tries again (docs/cli.md, "A save that fails").)doc"),
      {"replicas", "array of strings", "each non-empty",
       R"doc(Second-tier directories, e.g. `["/mnt/nfs/runs/mnist"]`: every save (`last.h5`, `best.h5`, milestones, `best_epoch_NNNN.h5`) is also written into each, atomically, the same sealed bytes as the run directory's file, by a background thread that writes only while the run directory's writer is idle (when saves come faster, each file's newest version). Each has its own writer lock. A replica that fails (full, gone, read-only) is reported once per kind of failure and training goes on; `on_error` governs only `dir`. On start the newest sound checkpoint of every tier is resumed from, and damaged or stale copies are repaired (docs/recovery.md).)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         const nlohmann::json* dirs = r.find(dotted);
         if (!dirs) return;
         if (!dirs->is_array()) r.fail(dotted, "must be an array of directories, got " + describe_json(*dirs));
         s.replicas.clear();
         for (size_t i = 0; i < dirs->size(); ++i) {
           const nlohmann::json& d = (*dirs)[i];
           const std::string key = dotted + "[" + std::to_string(i) + "]";
           if (!d.is_string() || d.get<std::string>().empty())
             r.fail(key, "must be a non-empty directory name, got " + describe_json(d));
           s.replicas.push_back(d.get<std::string>());
         }
       },
       [](const S& s) { return nlohmann::json(s.replicas); }},
      {"every_seconds", "real, nullable", "> 0",
       R"doc(Also rewrite `last.h5` at the first step boundary after this many seconds since the last save (of any kind), so a run loses at most about this much work whatever its step time. With several ranks rank 0's clock decides and every rank saves at the same step. `null` saves by time never.)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         const nlohmann::json* v = r.find(dotted);
         if (!v) return;
         if (v->is_null()) {
           s.every_seconds.reset();
           return;
         }
         const double seconds = r.real_value(dotted, *v);
         r.require(dotted, seconds > 0, "must be > 0");
         s.every_seconds = seconds;
       },
       [](const S& s) { return s.every_seconds ? nlohmann::json(*s.every_seconds) : nlohmann::json(nullptr); }},
      integer_key("keep_best", &S::keep_best, 0, kConfigInt64Max, "≥ 0",
          R"doc(Keep the k best epochs by `train.early_stopping.monitor`, each as `best_epoch_NNNN.h5` (its epoch in the name); a better epoch replaces the worst of them. Milestone rotation never deletes them, and `best.h5` stays the best one. `0` keeps none besides `best.h5`.)doc"),
      boolean_key("peer_replica", &S::peer_replica,
          R"doc(Data-parallel jobs across hosts: the first rank on another host than rank 0 writes a copy of every checkpoint rank 0 saves into `dir` on its own host (the same path, its own disk), from its own copy of the state, which is rank 0's bit for bit. On start every rank reports the newest sound checkpoint it can see, the job resumes from the newest, sent to every rank over the job's collective, so a job relaunched after rank 0's host and its disk are lost resumes from the other host's copy. A copy that fails is reported once per kind of failure; training goes on. Ignored in one process, and when that rank shares rank 0's directory.)doc"),
      {"memory_tier", "string, nullable", "a directory, or `null`",
       R"doc(Keep the state after every training step in a slot file in this directory, e.g. `"/dev/shm"` (shared memory: it survives a SIGKILL of the process, not a reboot), so that a relaunch after a crash resumes at most one step behind. Two slots written in turn, each sealed with a digest. The run removes the file when it ends or is stopped by a signal. One process on the CPU for now; it costs about 2 % of a step (docs/recovery.md, "The memory tier"). `null` keeps nothing there.)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         const nlohmann::json* v = r.find(dotted);
         if (!v) return;
         if (v->is_null()) {
           s.memory_tier.reset();
           return;
         }
         if (!v->is_string() || v->get<std::string>().empty())
           r.fail(dotted, "must be a directory or null, got " + describe_json(*v));
         s.memory_tier = v->get<std::string>();
       },
       [](const S& s) { return s.memory_tier ? nlohmann::json(*s.memory_tier) : nlohmann::json(nullptr); }},
  };
  return keys;
}

const ConfigSection<LoggingConfig>& logging_config_keys() {
  using S = LoggingConfig;
  static const ConfigSection<S> keys = {boolean_key("tensorboard", &S::tensorboard,
          R"doc(After each epoch (and once more with the test loss and accuracy at the end), rewrite the TensorBoard event file `<checkpoint.dir>/tensorboard/events.out.tfevents.<start>.<host>` with the scalars of every epoch so far: `train_loss`, `val_loss`, `val_acc`, `lr`, `loss_scale`, `epoch_seconds` (step = epoch), then `test_loss` and `test_acc`. `tensorboard --logdir runs/` shows them. The file is rewritten whole and atomically from the run's history, like `metrics.jsonl`, so a resumed run continues the same file without duplicating or losing epochs. Wall times are the file's start time plus the cumulative training seconds, so TensorBoard's "relative" axis shows training time, pauses excluded.)doc")};
  return keys;
}

const ConfigSection<CudaConfig>& cuda_config_keys() {
  using S = CudaConfig;
  static const ConfigSection<S> keys = {
      boolean_key("deterministic", &S::deterministic,
          R"doc(Restrict cuDNN to deterministic algorithms, so the same seed gives the same bits. `false` allows faster algorithms that may be non-deterministic. It has no effect on the CPU.)doc"),
      boolean_key("batch_chunks", &S::batch_chunks,
          R"doc(`true`: compute every batch by its 8 fixed chunks (docs/distributed.md, "GPU ranks"), so a CUDA run gives the same bits at every world size. `false` runs each layer over the whole batch at once: faster, but one process only (a CUDA run on several ranks is refused). The default stays `false` until the chunked CUDA kernels have run on GPUs more than once (they ran once, on an H200: `tools/gpu-check.sh`, stages op-tests, nccl and ranks). It has no effect on the CPU, which always computes by chunks.)doc"),
      boolean_key("graphs", &S::graphs,
          R"doc(`true`: after one step of a batch size that allocates nothing, capture the next step of that size as a CUDA graph and replay it for every later one, across saves, evaluations and epochs: one launch a step instead of about 60, and the same bits as `false`, which launches every op of every step. `engine train` then prints `cuda graphs: N captured, M launched`. Used in one process with `cuda.batch_chunks=false` (the chunked CUDA batch norm still finishes on the host inside its op); elsewhere steps run eagerly. The default stays `false` until graphs have run on a GPU (`tools/gpu-check.sh`, stage graphs); on an emulated device (tests/emulated_cuda/) graphs on and off give the same checkpoint. It has no effect on the CPU.)doc"),
  };
  return keys;
}

const ConfigSection<DistConfig>& dist_config_keys() {
  using S = DistConfig;
  static const ConfigSection<S> keys = {
      choice_key("backend", &S::backend, {DistBackend::Auto, DistBackend::Mpi, DistBackend::Nccl},
                 "`auto`, `mpi`, `nccl`",
          R"doc(The library that moves data between ranks. `auto`: NCCL for CUDA ranks, MPI for CPU ranks. `mpi` or `nccl` forces one; `nccl` needs CUDA ranks and a build with NCCL.)doc"),
      real_key("timeout_s", &S::timeout_s, [](double v) { return v > 0; }, "must be > 0", "> 0",
          R"doc(A collective that has not completed after this many seconds means a rank has died or stopped responding: every rank ends with a message naming the rank that did not answer, instead of waiting forever.)doc"),
      {"chunks", "integer", "a power of two, 1 … 1024",
       R"doc(The fixed chunks a batch is cut into; every cross-sample sum is the tree over them, so a run has the same bits on any number of ranks up to `dist.chunks` (uneven splits included), and more ranks are refused. A property of the run: it is stored in the checkpoint's config, and resuming with another value is refused.)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         r.integer(dotted, s.chunks, 1, kMaxTreeChunks);
         r.require(dotted, (s.chunks & (s.chunks - 1)) == 0, "must be a power of two");
       },
       [](const S& s) { return nlohmann::json(s.chunks); }},
  };
  return keys;
}

}  // namespace engine
