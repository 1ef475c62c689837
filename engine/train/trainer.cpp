#include "engine/trainer.h"

#include "engine/build_info.h"

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "engine/batch_chunks.h"
#include "nn/dispatch.h"
#include "train/save_verification.h"
#include "train/time_budget.h"

namespace engine {

using Clock = std::chrono::steady_clock;

namespace {
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool lower_is_better(MonitorMetric monitor) { return monitor == MonitorMetric::ValLoss; }

// The partial-epoch loss buffer (trainer/epoch_sample_loss) has one entry per training
// image. At an epoch boundary it holds nothing (the next epoch starts by zeroing it), so
// a training set of another size is accepted there: the saved buffer is replaced by an
// empty one of the live size. Mid-epoch it is left as it is, and refused.
void accept_resized_buffer_at_epoch_boundary(std::map<std::string, StateDict>& groups,
                                             const Tensor& live_buffer) {
  auto g = groups.find("trainer");
  if (g == groups.end()) return;
  auto buf = g->second.tensors.find("epoch_sample_loss");
  auto step = g->second.scalars.find("step_in_epoch");
  if (buf == g->second.tensors.end() || step == g->second.scalars.end() ||
      !std::holds_alternative<int64_t>(step->second))
    return;
  if (std::get<int64_t>(step->second) != 0 || buf->second.shape() == live_buffer.shape() ||
      buf->second.dtype() != live_buffer.dtype())
    return;
  buf->second = Tensor::zeros(live_buffer.shape(), live_buffer.dtype());
}

// Says why a mid-epoch checkpoint's loss buffer of another size cannot be taken over.
void explain_resized_buffer_mid_epoch(StateReport& report, const std::map<std::string, StateDict>& groups) {
  for (std::string& m : report.mismatched) {
    if (m.rfind("trainer/epoch_sample_loss:", 0) != 0) continue;
    int64_t step = -1;
    try {
      step = groups.at("trainer").get_int("step_in_epoch");
    } catch (const std::exception&) {
      continue;
    }
    m += " (the checkpoint stopped mid-epoch, after step " + std::to_string(step) +
         ", and its position in the shuffled epoch depends on the training set's size: "
         "data.train_limit and data.val_split can change only at an epoch boundary)";
  }
}

}  // namespace

const char* checkpoint_kind_name(CheckpointKind k) {
  switch (k) {
    case CheckpointKind::Last: return "last";
    case CheckpointKind::Best: return "best";
    case CheckpointKind::Milestone: return "milestone";
    case CheckpointKind::MidEpoch: return "mid-epoch";
  }
  return "?";
}

// ---- the trainer's own state groups ----------------------------------------------

class Trainer::CounterState : public Stateful {
 public:
  explicit CounterState(Trainer& t) : t_(t) {}
  StateDict state() const override {
    StateDict d;
    d.scalars["epoch"] = t_.epoch_;
    d.scalars["global_step"] = t_.global_step_;
    d.scalars["step_in_epoch"] = t_.step_in_epoch_;
    d.scalars["epoch_shuffle_offset"] = static_cast<int64_t>(t_.epoch_shuffle_offset_);
    d.scalars["best_metric"] = t_.best_metric_;
    d.scalars["best_epoch"] = t_.best_epoch_;
    d.scalars["epochs_without_improvement"] = t_.epochs_without_improvement_;
    d.scalars["monitor"] = std::string(to_string(t_.cfg_.train.early_stopping.monitor));
    d.scalars["epoch_elapsed_seconds"] = t_.epoch_elapsed_seconds();
    d.tensors["epoch_sample_loss"] = t_.epoch_sample_loss_;
    return d;
  }
  void load_state(const StateDict& in) override {
    if (in.get_string("monitor") != to_string(t_.cfg_.train.early_stopping.monitor))
      throw std::runtime_error("checkpoint monitors '" + in.get_string("monitor") +
                               "' but the config monitors '" +
                               to_string(t_.cfg_.train.early_stopping.monitor) + "'");
    t_.epoch_ = in.get_int("epoch");
    t_.global_step_ = in.get_int("global_step");
    t_.step_in_epoch_ = in.get_int("step_in_epoch");
    t_.epoch_shuffle_offset_ = static_cast<uint64_t>(in.get_int("epoch_shuffle_offset"));
    t_.best_metric_ = in.get_real("best_metric");
    t_.best_epoch_ = in.get_int("best_epoch");
    t_.epochs_without_improvement_ = in.get_int("epochs_without_improvement");
    t_.epoch_elapsed_before_ = in.get_real("epoch_elapsed_seconds");
    t_.epoch_sample_loss_.copy_from(in.get_tensor("epoch_sample_loss"));
  }

 private:
  Trainer& t_;
};

class Trainer::MetricsState : public Stateful {
 public:
  explicit MetricsState(Trainer& t) : t_(t) {}
  StateDict state() const override {
    StateDict d;
    auto series = [&](const char* key, double EpochMetrics::*field) {
      std::vector<double> v;
      for (const EpochMetrics& m : t_.history_) v.push_back(m.*field);
      d.scalars[key] = v;
    };
    std::vector<double> epochs;
    for (const EpochMetrics& m : t_.history_) epochs.push_back(static_cast<double>(m.epoch));
    d.scalars["epoch"] = epochs;
    for (const EpochMetricField& f : epoch_metric_fields()) series(f.name, f.member);
    return d;
  }
  void load_state(const StateDict& in) override {
    const auto& epochs = in.get_series("epoch");
    std::vector<EpochMetrics> h(epochs.size());
    auto fill = [&](const char* key, double EpochMetrics::*field) {
      const auto& v = in.get_series(key);
      if (v.size() != h.size())
        throw std::runtime_error(std::string("metrics/") + key + " has " +
                                 std::to_string(v.size()) + " entries, metrics/epoch has " +
                                 std::to_string(h.size()));
      for (std::size_t i = 0; i < h.size(); ++i) h[i].*field = v[i];
    };
    for (std::size_t i = 0; i < h.size(); ++i) h[i].epoch = static_cast<int64_t>(epochs[i]);
    for (const EpochMetricField& f : epoch_metric_fields()) fill(f.name, f.member);
    t_.history_ = std::move(h);
  }

 private:
  Trainer& t_;
};

// ---- construction ------------------------------------------------------------------

Trainer::Trainer(Config cfg, Device device, std::unique_ptr<Model> model, TrainerObserver* observer,
                 SplitsNeeded splits, std::unique_ptr<Dataset> data, Collective* collective)
    : cfg_(std::move(cfg)), config_json_(config_to_json(cfg_).dump()), device_(device), observer_(observer ? observer : &silent_),
      data_(std::move(data)), rng_(cfg_.seed), model_(std::move(model)) {
  // cfg.cuda.deterministic is process-wide: the host applies
  // it (apply_process_settings, engine/process_settings.h), not each Trainer.
  if (!model_) throw std::invalid_argument("Trainer: no model given");
  (void)cpu_kernels_in_use();  // ENGINE_CPU_KERNELS that this CPU cannot run: refused here, not mid-step
  if (collective) collective_ = collective;
  require_world_size_fits(collective_->size(), cfg_.dist.chunks);
  if (collective_->size() > 1) {
    if (device_.is_cuda())
      throw std::invalid_argument("data-parallel training on " + std::to_string(collective_->size()) +
                                  " ranks runs on the CPU only for now (device " + device_.str() +
                                  ": the CUDA layers compute by chunks, but the trainer's loss and "
                                  "per-sample exchanges on GPU memory are not wired yet)");
    if (!model_->set_batch_chunks(nullptr))
      throw std::invalid_argument("model " + model_->name() +
                                  " does not support data-parallel training (Model::set_batch_chunks)");
  }
  if (!data_) data_ = make_dataset(cfg_.data, device_);
  if (data_->device() != device_)
    throw std::invalid_argument("Trainer: the dataset holds its splits on " + data_->device().str() +
                                ", the trainer runs on " + device_.str());
  if (model_->input_shape() != data_->sample_shape() || model_->num_classes() != data_->num_classes())
    throw std::invalid_argument("model " + model_->name() + " takes " + model_->input_shape().str() +
                                " images in " + std::to_string(model_->num_classes()) +
                                " classes, the dataset has " + data_->sample_shape().str() + " in " +
                                std::to_string(data_->num_classes()) + " (key model.name)");
  // Fail fast on missing or corrupt data, before any training.
  if (splits == SplitsNeeded::All) data_->get(Split::Train);
  else data_->get(Split::Test);
  model_->reset_parameters(rng_);
  model_->to(device_);
  // fp16: conv and linear math on fp16 inputs with fp32 accumulation (CUDA only; the
  // CPU backend is fp32 and keeps the loss scaler's state unchanged).
  model_->set_precision(compute_precision());
  const OptimizerConfig& o = cfg_.optimizer;
  optimizer_ = std::make_unique<AdamOptimizer>(to_string(o.name), model_->parameters(), o.lr, o.beta1,
                                               o.beta2, o.eps, o.weight_decay);
  scheduler_ = std::make_unique<LrScheduler>(to_string(cfg_.scheduler.name), o.lr, cfg_.effective_t_max(),
                                             cfg_.scheduler.eta_min);
  const LossScaleConfig& ls = cfg_.precision.loss_scale;
  scaler_ = std::make_unique<LossScaler>(cfg_.precision.mode == PrecisionMode::Fp16, ls.init, ls.growth_factor,
                                         ls.backoff_factor, ls.growth_interval);
  scaler_->set_active(device_.is_cuda());
  if (scaler_->enabled() && device_.is_cpu())
    observer_->on_message(
        "precision.mode fp16 needs the CUDA backend: training in fp32 on the CPU, "
        "loss-scaler state kept unchanged");
  if (collective_->size() > 1) {  // CPU ranks (refused above on CUDA): ZeRO-1
    std::vector<int64_t> sizes;
    for (Parameter* p : model_->parameters()) {
      sizes.push_back(p->value.numel());
      param_values_.push_back(&p->value);
      param_grads_.push_back(&p->grad);
    }
    shards_ = std::make_unique<ParameterShards>(std::move(sizes), collective_);
  }
  counter_state_ = std::make_unique<CounterState>(*this);
  metrics_state_ = std::make_unique<MetricsState>(*this);
  best_metric_ = lower_is_better(cfg_.train.early_stopping.monitor)
                     ? std::numeric_limits<double>::infinity()
                     : -std::numeric_limits<double>::infinity();
  epoch_sample_loss_ = Tensor::zeros({splits == SplitsNeeded::All ? data_->get(Split::Train).count : 0},
                                     DType::F32, device_);
}

Trainer::~Trainer() = default;

std::vector<std::pair<std::string, Stateful*>> Trainer::builtin_components() {
  return {{"model", model_.get()},         {"optimizer", optimizer_.get()},
          {"scheduler", scheduler_.get()}, {"scaler", scaler_.get()},
          {"rng", &rng_},                  {"trainer", counter_state_.get()},
          {"metrics", metrics_state_.get()}};
}

std::vector<std::pair<std::string, Stateful*>> Trainer::components() {
  std::vector<std::pair<std::string, Stateful*>> all = builtin_components();
  all.insert(all.end(), host_groups_.begin(), host_groups_.end());
  return all;
}

void Trainer::add_state_group(const std::string& name, Stateful* component) {
  if (!component) throw std::invalid_argument("state group '" + name + "': no component given");
  const bool valid_name =
      !name.empty() && name != "." && name != ".." &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
          std::string::npos;
  if (!valid_name)
    throw std::invalid_argument("state group name '" + name + "' is not valid (letters, digits, '_', '-', '.')");
  for (const auto& [existing, c] : components())
    if (existing == name) throw std::invalid_argument("state group '" + name + "' is already registered");
  host_groups_.emplace_back(name, component);
}

Precision Trainer::compute_precision() const {
  return device_.is_cuda() && cfg_.precision.mode == PrecisionMode::Fp16 ? Precision::Fp16 : Precision::Fp32;
}

Shape Trainer::batch_shape(int64_t n) const {
  const ImageShape s = data_->sample_shape();
  return {n, s.channels, s.height, s.width};
}

// ---- training ------------------------------------------------------------------------

template <class SinkCall>
void Trainer::call_sink(SinkCall&& call) {
  if (!sink_) return;
  if (collective_->size() == 1) return call();
  if (held_sink_error_) return;  // the run stops at the next agreement: no further saves
  try {
    call();
  } catch (...) {
    held_sink_error_ = std::current_exception();
  }
}

namespace {
// What a rank's held sink failure was, as agreed between the ranks (the largest wins).
enum class SinkFailure : int64_t { None = 0, Other = 1, Write = 2 };
}  // namespace

Trainer::Agreed Trainer::agree(bool checkpoint_asked, bool out_of_time_on_rank0) {
  const Agreed local{control_.stop_requested() || stop_agreed_, checkpoint_asked, out_of_time_on_rank0};
  if (collective_->size() == 1) return local;
  const int rank = collective_->rank();
  SinkFailure failure = SinkFailure::None;
  if (held_sink_error_) try {
      std::rethrow_exception(held_sink_error_);
    } catch (const CheckpointWriteError&) {
      failure = SinkFailure::Write;
    } catch (...) {
      failure = SinkFailure::Other;
    }
  // One allgather of five int64 per call. Only rank 0's clock decides the time limit.
  const std::vector<int64_t> all = collective_->agree_max(
      {local.stop, local.checkpoint, rank == 0 && local.out_of_time, static_cast<int64_t>(failure),
       failure == SinkFailure::None ? 0 : rank + 1});
  if (all[3] != static_cast<int64_t>(SinkFailure::None)) {
    if (held_sink_error_) {
      const std::exception_ptr e = held_sink_error_;
      held_sink_error_ = nullptr;
      std::rethrow_exception(e);
    }
    const std::string what = "rank " + std::to_string(rank) + ": rank " + std::to_string(all[4] - 1) +
                             " could not save a checkpoint (its message says why), so every rank stops";
    if (all[3] == static_cast<int64_t>(SinkFailure::Write)) throw CheckpointWriteError(what);
    throw std::runtime_error(what);
  }
  stop_agreed_ = all[0] != 0;
  return {stop_agreed_, all[1] != 0, all[2] != 0};
}

FitResult Trainer::fit(const StopPlan& stop, RunSink* sink) {
  // The sink, the requests and the deadline belong to this run: whatever is left of
  // them when it returns does not reach the next fit().
  struct RunScope {
    Trainer& t;
    ~RunScope() {
      t.sink_ = nullptr;
      t.time_budget_.reset();
      t.control_.clear_stop();
      t.control_.take_checkpoint_request();
      t.stop_agreed_ = false;
      t.held_sink_error_ = nullptr;
    }
  } run_scope{*this};
  sink_ = sink;
  FitResult result;
  try {
    result = fit_loop(stop);
  } catch (...) {
    // The saves in flight complete (or fail) before the error leaves; the first error wins.
    if (sink_) try {
        sink_->flush(*this);
      } catch (...) {
      }
    throw;
  }
  call_sink([&] { sink_->flush(*this); });
  // Several ranks: a failure of the saves just flushed reaches every rank here, so all
  // of them end the same way (CheckpointWriteError: exit 3 on every rank).
  if (collective_->size() > 1) agree(false, false);
  gather_optimizer_shards();  // every rank returns here: state() is whole again
  return result;
}

FitResult Trainer::fit_loop(const StopPlan& stop) {
  FitResult result;
  if (stop.time_limit_seconds)
    time_budget_ = std::make_unique<TimeBudget>(stop.time_limit_from.value_or(Clock::now()),
                                                *stop.time_limit_seconds);
  stop_cause_ = FitResult::StopCause::None;
  auto stopped = [&](FitResult::StopCause cause) {
    result.ending = FitResult::Ending::Stopped;
    result.stop_cause = cause;
    result.epochs_done = epoch_;
    return result;
  };
  bool stop_early = early_stop_reached();
  while (!stop_early && epoch_ < cfg_.train.epochs) {
    if (stop.after_epochs && epoch_ >= *stop.after_epochs) {
      result.ending = FitResult::Ending::Stopped;
      result.stop_cause = FitResult::StopCause::EpochLimit;
      break;
    }
    const int64_t steps = steps_per_epoch();
    // Several ranks: rank 0's budget decides for all (and a held save failure surfaces).
    const bool rank0_late = time_budget_ && collective_->rank() == 0 && out_of_time(step_in_epoch_ + 1 >= steps);
    if (collective_->size() > 1 ? agree(false, rank0_late).out_of_time : rank0_late) {
      // Between epochs (or before the first step of a resumed run): the state here is
      // exactly what a checkpoint of it resumes from.
      save(step_in_epoch_ > 0 ? CheckpointKind::MidEpoch : CheckpointKind::Last);
      observer_->on_message(time_limit_message());
      return stopped(FitResult::StopCause::TimeLimit);
    }
    const auto t0 = Clock::now();
    bool interrupted = false;
    train_epoch(interrupted);
    if (interrupted) return stopped(stop_cause_);
    end_epoch(seconds_since(t0), stop_early, interrupted);
    if (interrupted) return stopped(stop_cause_);
  }
  result.epochs_done = epoch_;
  if (result.ending != FitResult::Ending::Stopped) {
    if (stop_early) result.ending = FitResult::Ending::EarlyStopped;
    const bool rank0_late =
        time_budget_ && collective_->rank() == 0 &&
        !time_budget_->fits(time_budget_->eval_estimate(data_->get(Split::Test).count, cfg_.data.batch_size),
                            save_estimate());
    if (collective_->size() > 1 ? agree(false, rank0_late).out_of_time : rank0_late) {
      observer_->on_message("time limit: training is complete and saved in last.h5, but the test "
                            "evaluation would overrun; run the same command again to evaluate");
      return stopped(FitResult::StopCause::TimeLimit);
    }
    // Training is over: hold the test images instead of the training images.
    model_->release_workspaces();
    data_->release(Split::Train);
    result.test = evaluate_unless_stopped(Split::Test);
    if (!result.test) {
      observer_->on_message("stopped during the test evaluation; training is complete and saved in "
                            "last.h5; run the same command again to evaluate");
      return stopped(FitResult::StopCause::Requested);
    }
    record_metrics(result.test);
  }
  return result;
}

bool Trainer::out_of_time(bool last_step_of_epoch) {
  double need = time_budget_->step_estimate();
  // The last step of an epoch brings validation and the end-of-epoch saves with it
  // (last.h5, and best.h5 or a milestone; the stop's own save is counted by fits()).
  if (last_step_of_epoch)
    need += time_budget_->eval_estimate(data_->get(Split::Val).count, cfg_.data.batch_size) +
            2 * save_estimate();
  return !time_budget_->fits(need, save_estimate());
}

std::string Trainer::time_limit_message() const {
  char left[96] = "rank 0's time limit near";  // a rank whose host gave it no limit of its own
  if (time_budget_)
    std::snprintf(left, sizeof left, "%.1f s of the %.1f s limit left", time_budget_->remaining(),
                  time_budget_->limit());
  return "time limit: stopping at epoch " + std::to_string(epoch_ + 1) + " step " +
         std::to_string(step_in_epoch_) + " with " + left +
         " (the next step and a checkpoint would not fit); last.h5 saved, resume with the same command";
}

int64_t Trainer::steps_per_epoch() {
  const int64_t n = data_->get(Split::Train).count;
  const int batch = cfg_.data.batch_size;
  return (n + batch - 1) / batch;
}

void Trainer::prepare_epoch() {
  const int64_t n = data_->get(Split::Train).count;
  if (epoch_sample_loss_.numel() != n)
    throw std::logic_error("this Trainer was built to evaluate only (SplitsNeeded::TestOnly): it cannot train");
  if (step_in_epoch_ == 0) {
    epoch_shuffle_offset_ = rng_.take(RngStream::Shuffle, Rng::permutation_draws(static_cast<int32_t>(n)));
    epoch_sample_loss_.zero();
  }
  optimizer_->set_lr(scheduler_->lr());
  if (permutation_offset_ == epoch_shuffle_offset_) return;
  // The permutation is re-derived from its saved offset, so a mid-epoch resume sees
  // the same order.
  const std::vector<int32_t> perm = rng_.permutation(RngStream::Shuffle, epoch_shuffle_offset_,
                                                     static_cast<int32_t>(n));
  Tensor perm_host = Tensor::empty({n}, DType::I32);
  std::copy(perm.begin(), perm.end(), perm_host.i32());
  permutation_ = device_.is_cpu() ? perm_host : perm_host.to(device_);
  permutation_offset_ = epoch_shuffle_offset_;
  epoch_clock_ = Clock::now();
}

void Trainer::run_step() {
  const SplitData& train = data_->get(Split::Train);
  const int64_t n = train.count;
  const int batch = cfg_.data.batch_size;
  const int classes = model_->num_classes();
  const int64_t start = step_in_epoch_ * batch;
  const int b = static_cast<int>(std::min<int64_t>(batch, n - start));
  // This rank's chunks of the batch (all of it in one process, docs/distributed.md).
  BatchChunks plan(b, collective_, cfg_.dist.chunks);
  if (shards_) {
    // This rank keeps and updates its shard of the moments only; the layers leave their
    // weight and bias block sums for the one pass after backward.
    optimizer_->shard(*shards_);
    grad_parts_.clear();
    plan.defer_gradients(&grad_parts_);
  }
  const int local = plan.local_count();
  const int64_t first = start + plan.local_begin();
  if (!batch_x_.defined() || batch_x_.dim(0) != local) {
    batch_x_ = Tensor::empty(batch_shape(local), DType::F32, device_);
    batch_labels_ = Tensor::empty({local}, DType::I32, device_);
    dlogits_ = Tensor::empty({local, classes}, DType::F32, device_);
    sample_correct_ = Tensor::empty({local}, DType::F32, device_);
  }
  ENGINE_DISPATCH(device_, gather_batch, local, static_cast<int>(data_->sample_shape().numel()),
                  train.images.u8(), train.labels.u8(), permutation_.i32() + first,
                  static_cast<float>(cfg_.data.mean), static_cast<float>(cfg_.data.std), batch_x_.f32(),
                  batch_labels_.i32());
  struct PlanScope {
    Model& m;
    ~PlanScope() { m.set_batch_chunks(nullptr); }
  } plan_scope{*model_};
  model_->set_batch_chunks(&plan);
  Tensor logits = model_->forward(batch_x_, Mode::Train, rng_);
  if (device_.is_cpu())  // the gradient of the mean over the global batch
    kernels::cpu::cross_entropy_part(local, b, classes, logits.f32(), batch_labels_.i32(),
                                     scaler_->loss_scale(), dlogits_.f32(), epoch_sample_loss_.f32() + first,
                                     sample_correct_.f32());
  else
    kernels::cuda::cross_entropy(b, classes, logits.f32(), batch_labels_.i32(), scaler_->loss_scale(),
                                 dlogits_.f32(), epoch_sample_loss_.f32() + start, sample_correct_.f32());
  model_->backward(dlogits_);
  // Every rank holds every sample's loss (the state is the same on all ranks).
  plan.gather_samples(epoch_sample_loss_.f32() + start);
  if (shards_) {
    // Every gradient complete in this rank's shard (one alltoall, the tree order), the
    // shard updated, every rank's shard back to every rank (one allgather). The loss
    // scaler is inactive here (CPU ranks: fp32), so no step is skipped.
    shards_->reduce_scatter(plan, grad_parts_, param_grads_);
    optimizer_->step();
    shards_->allgather(param_values_);
  } else {
    const bool found_inf = scaler_->unscale(model_->parameters());
    scaler_->update(found_inf);
    if (!found_inf) optimizer_->step();
  }
  ++step_in_epoch_;
  ++global_step_;
}

void Trainer::train_epoch(bool& interrupted) {
  prepare_epoch();
  const int64_t n = data_->get(Split::Train).count;
  const int batch = cfg_.data.batch_size;
  const int64_t steps = steps_per_epoch();
  observer_->on_epoch_begin(epoch_ + 1, cfg_.train.epochs, steps);
  const auto t0 = Clock::now();
  auto last_report = t0;
  const int64_t first_step = step_in_epoch_;
  const bool ranks = collective_->size() > 1;
  bool time_up = false;  // several ranks: rank 0's decision, agreed after the previous step

  while (step_in_epoch_ < steps) {
    // The time limit between steps (fit() checks before the epoch's first one: at step 0
    // this epoch's shuffle is already drawn, which a checkpoint must not record).
    if (ranks ? time_up : time_budget_ && step_in_epoch_ > first_step && out_of_time(step_in_epoch_ + 1 == steps)) {
      save(CheckpointKind::MidEpoch);
      observer_->on_message(time_limit_message());
      stop_cause_ = FitResult::StopCause::TimeLimit;
      interrupted = true;
      return;
    }
    const auto step_t0 = Clock::now();
    run_step();
    if (time_budget_) time_budget_->record_step(seconds_since(step_t0));
    call_sink([&] { sink_->after_step(*this); });

    const bool epoch_done = step_in_epoch_ == steps;
    // The ranks act on the same requests at the same step: a signal that reaches them at
    // different steps still gives one stop, or one checkpoint, at one step.
    const bool checkpoint_local = control_.take_checkpoint_request();
    const Agreed agreed =
        agree(checkpoint_local, ranks && !epoch_done && time_budget_ && collective_->rank() == 0 &&
                                    out_of_time(step_in_epoch_ + 1 == steps));
    time_up = agreed.out_of_time;
    const bool halt = agreed.stop;
    // A checkpoint request (SIGUSR1) saves now and training goes on; at the end of an
    // epoch, end_epoch's last.h5 answers it.
    const bool checkpoint_asked = agreed.checkpoint;
    if (!epoch_done && ((cfg_.checkpoint.every_n_steps &&
                         global_step_ % *cfg_.checkpoint.every_n_steps == 0) || halt || checkpoint_asked))
      save(CheckpointKind::MidEpoch);
    // A checkpoint request wants a file it can count on: complete before the message.
    if (checkpoint_asked && !halt && !epoch_done) call_sink([&] { sink_->flush(*this); });
    if (checkpoint_asked && !halt && !held_sink_error_)
      observer_->on_message(epoch_done ? "checkpoint requested: last.h5 is written at the end of epoch " +
                                             std::to_string(epoch_ + 1)
                                       : "checkpoint requested: last.h5 saved at epoch " +
                                             std::to_string(epoch_ + 1) + " step " +
                                             std::to_string(step_in_epoch_) + "; training goes on");
    observer_->on_step_end(global_step_);
    if (halt && !epoch_done) {
      observer_->on_message("stopped at epoch " + std::to_string(epoch_ + 1) + " step " +
                            std::to_string(step_in_epoch_) + "; resume with the same command");
      stop_cause_ = FitResult::StopCause::Requested;
      interrupted = true;
      return;
    }
    const auto now = Clock::now();
    if (epoch_done || now - last_report > std::chrono::milliseconds(200)) {
      last_report = now;
      const double secs = seconds_since(t0);
      const int64_t done_samples = std::min(n, step_in_epoch_ * batch);
      const int64_t this_run = done_samples - std::min(n, first_step * batch);
      Progress p;
      p.epoch = epoch_ + 1;
      p.epochs = cfg_.train.epochs;
      p.step = step_in_epoch_;
      p.steps = steps;
      p.running_loss = ENGINE_DISPATCH(device_, reduce_sum, done_samples, epoch_sample_loss_.f32()) /
                       static_cast<double>(done_samples);
      p.samples_per_second = secs > 0 ? this_run / secs : 0;
      p.eta_seconds = p.samples_per_second > 0 ? (n - done_samples) / p.samples_per_second : 0;
      observer_->on_progress(p);
    }
  }
}

double Trainer::epoch_elapsed_seconds() const {
  // The clock runs from the epoch's first step in this session (prepare_epoch); before
  // that step, only the earlier sessions' part counts.
  const bool running = step_in_epoch_ > 0 && permutation_offset_.has_value();
  return epoch_elapsed_before_ + (running ? seconds_since(epoch_clock_) : 0.0);
}

std::optional<bool> Trainer::finish_epoch(double seconds, EpochMetrics& m, Interruptible when) {
  const int64_t n = data_->get(Split::Train).count;
  m.train_loss = ENGINE_DISPATCH(device_, reduce_sum, n, epoch_sample_loss_.f32()) / static_cast<double>(n);
  const std::optional<EvalResult> val_done =
      when == Interruptible::Yes ? evaluate_unless_stopped(Split::Val) : std::optional<EvalResult>(evaluate(Split::Val));
  // Stopped during validation: nothing has changed yet.
  if (!val_done) return std::nullopt;
  const EvalResult& val = *val_done;
  m.val_loss = val.loss;
  m.val_acc = val.accuracy;
  m.lr = scheduler_->lr();
  m.loss_scale = scaler_->scale();
  m.epoch_seconds = epoch_elapsed_before_ + seconds;  // the part before a mid-epoch resume too
  epoch_elapsed_before_ = 0;
  scheduler_->step();
  ++epoch_;
  step_in_epoch_ = 0;
  m.epoch = epoch_;
  history_.push_back(m);

  const auto& es = cfg_.train.early_stopping;
  const double value = es.monitor == MonitorMetric::ValLoss ? m.val_loss : m.val_acc;
  const bool improved = lower_is_better(es.monitor) ? value < best_metric_ - es.min_delta
                                                    : value > best_metric_ + es.min_delta;
  if (improved) {
    best_metric_ = value;
    best_epoch_ = epoch_;
    epochs_without_improvement_ = 0;
  } else {
    ++epochs_without_improvement_;
  }
  return improved;
}

bool Trainer::early_stop_reached() const {
  const auto& es = cfg_.train.early_stopping;
  return es.patience > 0 && epochs_without_improvement_ >= es.patience;
}

void Trainer::end_epoch(double seconds, bool& stop_early, bool& interrupted) {
  EpochMetrics m;
  const std::optional<bool> improved = finish_epoch(seconds, m, Interruptible::Yes);
  if (!improved) {
    // Stopped during validation: the epoch's steps are all done (step_in_epoch ==
    // steps) and saved so; a resume runs this validation again and ends the epoch.
    save(CheckpointKind::MidEpoch);
    observer_->on_message("stopped during the validation of epoch " + std::to_string(epoch_ + 1) +
                          "; resume with the same command");
    stop_cause_ = FitResult::StopCause::Requested;
    interrupted = true;
    return;
  }
  const auto& es = cfg_.train.early_stopping;
  stop_early = early_stop_reached();

  // The activation buffers are rebuilt by the next forward; without them the
  // checkpoint image and its verification do not add to the training peak.
  model_->release_workspaces();
  batch_x_ = batch_labels_ = dlogits_ = sample_correct_ = Tensor();
  save(CheckpointKind::Last);
  if (*improved) save(CheckpointKind::Best);
  const auto& every = cfg_.checkpoint.every_n_epochs;
  if ((every && epoch_ % *every == 0) ||
      std::count(cfg_.checkpoint.keep_epochs.begin(), cfg_.checkpoint.keep_epochs.end(), epoch_))
    save(CheckpointKind::Milestone);
  record_metrics(std::nullopt);
  observer_->on_epoch_end(m);
  if (stop_early)
    observer_->on_message(std::string("early stopping: ") + to_string(es.monitor) + " has not improved for " +
                          std::to_string(epochs_without_improvement_) + " epochs (best " +
                          std::to_string(best_metric_) + " at epoch " +
                          std::to_string(best_epoch_) + ")");
}

void Trainer::require_epochs_left() const {
  if (epoch_ >= cfg_.train.epochs)
    throw std::logic_error("all " + std::to_string(cfg_.train.epochs) +
                           " epochs (train.epochs) are done");
}

StepResult Trainer::train_step() {
  require_epochs_left();
  const bool begins = step_in_epoch_ == 0;
  prepare_epoch();
  const int64_t steps = steps_per_epoch();
  if (begins) observer_->on_epoch_begin(epoch_ + 1, cfg_.train.epochs, steps);
  const int64_t n = data_->get(Split::Train).count;
  const int64_t start = step_in_epoch_ * cfg_.data.batch_size;
  run_step();
  observer_->on_step_end(global_step_);
  StepResult r;
  r.epoch = epoch_ + 1;
  r.step_in_epoch = step_in_epoch_;
  r.global_step = global_step_;
  gather_optimizer_shards();  // a step taken alone leaves the whole state (a collective)
  const int64_t b = std::min<int64_t>(cfg_.data.batch_size, n - start);
  r.loss = ENGINE_DISPATCH(device_, reduce_sum, b, epoch_sample_loss_.f32() + start) / static_cast<double>(b);
  if (step_in_epoch_ == steps) {
    EpochMetrics m;
    finish_epoch(seconds_since(epoch_clock_), m, Interruptible::No);
    observer_->on_epoch_end(m);
    r.epoch_end = m;
  }
  return r;
}

EpochMetrics Trainer::train_epoch() {
  require_epochs_left();
  for (;;) {
    StepResult r = train_step();
    if (r.epoch_end) return *r.epoch_end;
  }
}

// ---- evaluation ----------------------------------------------------------------------

EvalResult Trainer::evaluate(Split split) { return *evaluate_impl(split, nullptr); }

std::optional<EvalResult> Trainer::evaluate_unless_stopped(Split split) {
  const auto t0 = Clock::now();
  std::optional<EvalResult> r = evaluate_impl(split, &control_);
  if (r && time_budget_) time_budget_->record_eval(seconds_since(t0), r->count);
  return r;
}

std::optional<EvalResult> Trainer::evaluate_impl(Split split, const RunControl* stop) {
  const SplitData& d = data_->get(split);
  const int classes = model_->num_classes();
  EvalResult r;
  r.count = d.count;
  r.confusion.assign(classes, std::vector<int64_t>(classes, 0));
  if (d.count == 0) return r;
  const int batch = cfg_.data.batch_size;
  Tensor idx_host = Tensor::empty({d.count}, DType::I32);
  std::iota(idx_host.i32(), idx_host.i32() + d.count, 0);
  Tensor idx = device_.is_cpu() ? idx_host : idx_host.to(device_);
  Tensor losses = Tensor::empty({d.count}, DType::F32, device_);
  Tensor correct = Tensor::empty({d.count}, DType::F32, device_);
  Tensor predictions = Tensor::empty({d.count}, DType::I32);  // host
  Tensor x, labels;
  struct PlanScope {
    Model& m;
    ~PlanScope() { m.set_batch_chunks(nullptr); }
  } plan_scope{*model_};
  for (int64_t start = 0; start < d.count; start += batch) {
    // Several ranks: a stop requested on any of them ends every rank's evaluation here.
    if (stop && agree(false, false).stop) return std::nullopt;
    const int b = static_cast<int>(std::min<int64_t>(batch, d.count - start));
    // Each rank evaluates its chunks of the batch; the per-sample results are gathered.
    const BatchChunks plan(b, collective_, cfg_.dist.chunks);
    const int local = plan.local_count();
    const int64_t first = start + plan.local_begin();
    if (!x.defined() || x.dim(0) != local) {
      x = Tensor::empty(batch_shape(local), DType::F32, device_);
      labels = Tensor::empty({local}, DType::I32, device_);
    }
    ENGINE_DISPATCH(device_, gather_batch, local, static_cast<int>(data_->sample_shape().numel()), d.images.u8(),
                    d.labels.u8(), idx.i32() + first, static_cast<float>(cfg_.data.mean),
                    static_cast<float>(cfg_.data.std), x.f32(), labels.i32());
    model_->set_batch_chunks(&plan);
    Tensor logits = model_->forward(x, Mode::Eval, rng_);
    ENGINE_DISPATCH(device_, cross_entropy, local, classes, logits.f32(), labels.i32(), 1.0f, nullptr,
                    losses.f32() + first, correct.f32() + first);
    const std::vector<float> z = logits.to_vector();
    for (int i = 0; i < local; ++i) predictions.i32()[first + i] = kernels::argmax_first(z.data() + i * classes, classes);
    plan.gather_samples(losses.f32() + start);
    plan.gather_samples(correct.f32() + start);
    plan.gather_samples(predictions.i32() + start);
  }
  r.loss = ENGINE_DISPATCH(device_, reduce_sum, d.count, losses.f32()) / static_cast<double>(d.count);
  r.accuracy = ENGINE_DISPATCH(device_, reduce_sum, d.count, correct.f32()) / static_cast<double>(d.count);
  Tensor labels_host = d.labels.to(Device::cpu());
  for (int64_t i = 0; i < d.count; ++i) ++r.confusion[labels_host.u8()[i]][predictions.i32()[i]];
  return r;
}

Tensor Trainer::first_images(Split split, int64_t n) {
  const SplitData& d = data_->get(split);
  n = std::min(n, d.count);
  Tensor idx_host = Tensor::empty({n}, DType::I32);
  std::iota(idx_host.i32(), idx_host.i32() + n, 0);
  Tensor idx = device_.is_cpu() ? idx_host : idx_host.to(device_);
  Tensor x = Tensor::empty(batch_shape(n), DType::F32, device_);
  Tensor labels = Tensor::empty({n}, DType::I32, device_);
  ENGINE_DISPATCH(device_, gather_batch, static_cast<int>(n), static_cast<int>(data_->sample_shape().numel()),
                  d.images.u8(), d.labels.u8(), idx.i32(), static_cast<float>(cfg_.data.mean),
                  static_cast<float>(cfg_.data.std), x.f32(), labels.i32());
  return x;
}

Tensor Trainer::logits(Split split, int64_t n) {
  return model_->forward(first_images(split, n), Mode::Eval, rng_).to(Device::cpu());
}

// ---- checkpoints ---------------------------------------------------------------------

Checkpoint Trainer::snapshot() const {
  Checkpoint c;
  c.meta.saved_on = device_.str();
  c.config_json = config_json_;
  for (auto& [name, comp] : const_cast<Trainer*>(this)->components()) c.groups[name] = comp->state();
  return c;
}

namespace {
// The dist.chunks a checkpoint was trained with: its stored config's (8, the default,
// for checkpoints written before the key existed); nullopt when it has no config.
std::optional<int64_t> stored_dist_chunks(const Checkpoint& ckpt) {
  if (ckpt.config_json.empty()) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(ckpt.config_json, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  const auto dist = j.find("dist");
  if (dist == j.end() || !dist->is_object() || !dist->contains("chunks")) return BatchChunks::kDefaultChunks;
  const nlohmann::json& c = (*dist)["chunks"];
  return c.is_number_integer() ? std::optional<int64_t>(c.get<int64_t>()) : std::nullopt;
}
}  // namespace

StateReport Trainer::restore(const Checkpoint& ckpt, LoadMode mode, RestoreObserver* observer) {
  StateReport report;
  // The chunks fix the order of every cross-sample sum: a run resumed with others would
  // go on with other bits.
  if (const std::optional<int64_t> chunks = stored_dist_chunks(ckpt);
      mode == LoadMode::Strict && chunks && *chunks != cfg_.dist.chunks)
    throw std::runtime_error("the checkpoint was trained with dist.chunks = " + std::to_string(*chunks) +
                             ", this config has " + std::to_string(cfg_.dist.chunks) +
                             " (the chunks fix the order of every sum; resume with --set dist.chunks=" +
                             std::to_string(*chunks) + ")");
  auto comps = components();
  std::map<std::string, StateDict> groups = ckpt.groups;  // shares the tensors
  accept_resized_buffer_at_epoch_boundary(groups, epoch_sample_loss_);
  std::vector<StateDict> expected;
  for (auto& [name, comp] : comps) {
    expected.push_back(comp->state());
    auto it = groups.find(name);
    if (it == groups.end() && expected.back().empty()) report.missing.push_back(name + "/");
    report.merge(compare_state(expected.back(), it == groups.end() ? StateDict{} : it->second), name);
  }
  explain_resized_buffer_mid_epoch(report, groups);
  for (auto& [name, group] : groups) {
    bool known = false;
    for (auto& c : comps) known = known || c.first == name;
    if (!known) report.unexpected.push_back(name + "/");
  }
  if (mode == LoadMode::Strict && !report.clean())
    throw std::runtime_error("checkpoint does not match this model and config: " + report.summary());
  // Keep a deep copy to roll back to, so a failure halfway never leaves a half-loaded state.
  std::vector<StateDict> backup;
  for (const StateDict& e : expected) {
    StateDict b = e;
    for (auto& [k, t] : b.tensors) t = t.clone();
    backup.push_back(std::move(b));
  }
  // Every component touched is rolled back on failure, the one that threw included: it
  // may have changed part of its state before throwing.
  std::size_t touched = 0;
  try {
    for (std::size_t i = 0; i < comps.size(); ++i) {
      auto it = groups.find(comps[i].first);
      const StateDict given = it == groups.end() ? StateDict{} : it->second;
      touched = i + 1;
      comps[i].second->load_state(merge_matching(expected[i], given));
      if (observer) observer->after_group(comps[i].first);
    }
  } catch (...) {
    for (std::size_t i = 0; i < touched; ++i) comps[i].second->load_state(backup[i]);
    throw;
  }
  scaler_->set_active(device_.is_cuda());
  permutation_offset_.reset();  // the rng may have changed: derive the permutation again
  return report;
}

StateReport Trainer::resume_from(const std::string& path, LoadMode mode) {
  Checkpoint ckpt = load_checkpoint(path);
  try {
    return restore(ckpt, mode);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": " + e.what());
  }
}

void Trainer::save(CheckpointKind kind) {
  // Every rank saves at the same point (agreed): the moments are gathered here, and cut
  // again by the next step (saves in a row gather once).
  gather_optimizer_shards();
  call_sink([&] { sink_->save(*this, kind); });
}

void Trainer::gather_optimizer_shards() {
  if (shards_ && optimizer_->sharded()) optimizer_->unshard(*shards_);
}

int64_t Trainer::state_bytes() const {
  int64_t bytes = 0;
  for (auto& [name, comp] : const_cast<Trainer*>(this)->components()) {
    if (comp == optimizer_.get()) {
      bytes += optimizer_->state_bytes();
      continue;
    }
    for (const auto& [key, t] : comp->state().tensors) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

void Trainer::record_metrics(const std::optional<EvalResult>& test) {
  call_sink([&] { sink_->record_metrics(*this, test); });
}

double Trainer::save_estimate() const { return sink_ ? sink_->save_estimate(*this) : 0.0; }

void Trainer::save_checkpoint(const std::string& path) {
  const Checkpoint state = snapshot();
  engine::save_checkpoint(path, state);
  if (cfg_.checkpoint.verify) verify_saved_checkpoint(path, state, *model_);
}

}  // namespace engine
