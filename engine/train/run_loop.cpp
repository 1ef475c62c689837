#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/tensor_ops.h"
#include "train/run_protocol.h"
#include "train/time_budget.h"
#include "train/trainer_common.h"

// fit(): epochs, validation, saves, the time budget, stop and checkpoint requests,
// progress; every decision the ranks share goes through the run protocol.

namespace engine {

// ---- training ------------------------------------------------------------------------

std::vector<int64_t> best_epochs(const std::vector<EpochMetrics>& history, MonitorMetric monitor, int64_t k) {
  std::vector<const EpochMetrics*> order;
  for (const EpochMetrics& m : history) order.push_back(&m);
  auto value = [monitor](const EpochMetrics* m) { return monitor == MonitorMetric::ValLoss ? m->val_loss : m->val_acc; };
  std::stable_sort(order.begin(), order.end(), [&](const EpochMetrics* a, const EpochMetrics* b) {
    return lower_is_better(monitor) ? value(a) < value(b) : value(a) > value(b);
  });
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < order.size() && static_cast<int64_t>(i) < k; ++i) out.push_back(order[i]->epoch);
  return out;
}

template <class SinkCall>
void Trainer::call_sink(SinkCall&& call) {
  if (sink_) protocol_->call_sink(call);
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
      t.protocol_->reset();
      t.pending_digests_.clear();
    }
  } run_scope{*this};
  sink_ = sink;
  last_save_at_ = env_.monotonic_now();  // checkpoint.every_seconds counts from here
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
  protocol_->finish_run();
  gather_optimizer_shards();  // every rank returns here: state() is whole again
  return result;
}

FitResult Trainer::fit_loop(const StopPlan& stop) {
  FitResult result;
  if (stop.time_limit_seconds)
    time_budget_ = std::make_unique<TimeBudget>(env_, stop.time_limit_from.value_or(env_.monotonic_now()),
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
    if (protocol_->time_limit_now([&] { return time_budget_ && out_of_time(step_in_epoch_ + 1 >= steps); })) {
      // Between epochs (or before the first step of a resumed run): the state here is
      // exactly what a checkpoint of it resumes from.
      save(step_in_epoch_ > 0 ? CheckpointKind::MidEpoch : CheckpointKind::Last);
      observer_->on_message(time_limit_message());
      return stopped(FitResult::StopCause::TimeLimit);
    }
    const auto t0 = env_.monotonic_now();
    bool interrupted = false;
    train_epoch(interrupted);
    if (interrupted) return stopped(stop_cause_);
    end_epoch(seconds_since(env_, t0), stop_early, interrupted);
    if (interrupted) return stopped(stop_cause_);
    call_sink([&] { sink_->keep_step(*this); });
  }
  result.epochs_done = epoch_;
  if (result.ending != FitResult::Ending::Stopped) {
    if (stop_early) result.ending = FitResult::Ending::EarlyStopped;
    const bool test_late = protocol_->time_limit_now([&] {
      return time_budget_ &&
             !time_budget_->fits(time_budget_->eval_estimate(data_->get(Split::Test).count, cfg_.data.batch_size),
                                 save_estimate());
    });
    if (test_late) {
      observer_->on_message("time limit: training is complete and saved in last.h5, but the test "
                            "evaluation would overrun; run the same command again to evaluate");
      return stopped(FitResult::StopCause::TimeLimit);
    }
    // Training is over: hold the test images instead of the training images.
    drop_step_graphs();  // they point into the workspaces
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

void Trainer::train_epoch(bool& interrupted) {
  prepare_epoch();
  const int64_t n = data_->get(Split::Train).count;
  const int batch = cfg_.data.batch_size;
  const int64_t steps = steps_per_epoch();
  observer_->on_epoch_begin(epoch_ + 1, cfg_.train.epochs, steps);
  const auto t0 = env_.monotonic_now();
  auto last_report = t0;
  const int64_t first_step = step_in_epoch_;
  while (step_in_epoch_ < steps) {
    // The time limit between steps (fit() checks before the epoch's first one: at step 0
    // this epoch's shuffle is already drawn, which a checkpoint must not record).
    if (step_in_epoch_ > first_step && protocol_->time_limit_before_step([&] {
          return time_budget_ && out_of_time(step_in_epoch_ + 1 == steps);
        })) {
      save(CheckpointKind::MidEpoch);
      observer_->on_message(time_limit_message());
      stop_cause_ = FitResult::StopCause::TimeLimit;
      interrupted = true;
      return;
    }
    const auto step_t0 = env_.monotonic_now();
    run_step();
    if (time_budget_) time_budget_->record_step(seconds_since(env_, step_t0));
    call_sink([&] { sink_->after_step(*this); });

    const bool epoch_done = step_in_epoch_ == steps;
    // The ranks act on the same requests at the same step: a signal that reaches them at
    // different steps still gives one stop, or one checkpoint, at one step.
    const bool checkpoint_local = control_.take_checkpoint_request();
    // Several ranks: the step's digests ride along (the replicas compared, the moments'
    // parts added up), then the record goes to the sink, before any save of the step.
    RunProtocol::StepDigests digests;
    if (digest_awaits_ranks_) {
      digests.replica = replica_digest();
      digests.parts = digest_parts_;
    }
    const RunProtocol::Agreed agreed = protocol_->agree(
        control_.stop_requested(), checkpoint_local,
        [&] { return !epoch_done && time_budget_ && out_of_time(step_in_epoch_ + 1 == steps); },
        [&] { return !epoch_done && save_by_time_due(); }, digest_awaits_ranks_ ? &digests : nullptr);
    if (digest_awaits_ranks_) complete_step_digest(digests.parts, digests.replicas);
    // The CPU's records, every step (a GPU's wait in its ring for a save or the epoch's end).
    if (device_.is_cpu()) hand_step_digests();
    const bool halt = agreed.stop;
    // A checkpoint request (SIGUSR1) saves now and training goes on; at the end of an
    // epoch, end_epoch's last.h5 answers it.
    const bool checkpoint_asked = agreed.checkpoint;
    if (!epoch_done && ((cfg_.checkpoint.every_n_steps &&
                         global_step_ % *cfg_.checkpoint.every_n_steps == 0) || halt || checkpoint_asked ||
                        agreed.save_due))
      save(CheckpointKind::MidEpoch);
    // A checkpoint request wants a file it can count on: complete before the message.
    if (checkpoint_asked && !halt && !epoch_done) call_sink([&] { sink_->flush(*this); });
    if (checkpoint_asked && !halt && !protocol_->holds_sink_failure())
      observer_->on_message(epoch_done ? "checkpoint requested: last.h5 is written at the end of epoch " +
                                             std::to_string(epoch_ + 1)
                                       : "checkpoint requested: last.h5 saved at epoch " +
                                             std::to_string(epoch_ + 1) + " step " +
                                             std::to_string(step_in_epoch_) + "; training goes on");
    if (!epoch_done) call_sink([&] { sink_->keep_step(*this); });
    observer_->on_step_end(global_step_);
    if (halt && !epoch_done) {
      observer_->on_message("stopped at epoch " + std::to_string(epoch_ + 1) + " step " +
                            std::to_string(step_in_epoch_) + "; resume with the same command");
      stop_cause_ = FitResult::StopCause::Requested;
      interrupted = true;
      return;
    }
    const auto now = env_.monotonic_now();
    if (epoch_done || now - last_report > std::chrono::milliseconds(200)) {
      last_report = now;
      const double secs = seconds_since(env_, t0);
      const int64_t done_samples = std::min(n, step_in_epoch_ * batch);
      const int64_t this_run = done_samples - std::min(n, first_step * batch);
      Progress p;
      p.epoch = epoch_ + 1;
      p.epochs = cfg_.train.epochs;
      p.step = step_in_epoch_;
      p.steps = steps;
      p.running_loss = tt::reduce_sum(epoch_sample_loss_, 0, done_samples) / static_cast<double>(done_samples);
      p.samples_per_second = secs > 0 ? this_run / secs : 0;
      p.eta_seconds = p.samples_per_second > 0 ? (n - done_samples) / p.samples_per_second : 0;
      observer_->on_progress(p);
    }
  }
}

std::optional<bool> Trainer::finish_epoch(double seconds, EpochMetrics& m, Interruptible when) {
  const int64_t n = data_->get(Split::Train).count;
  m.train_loss = tt::reduce_sum(epoch_sample_loss_, 0, n) / static_cast<double>(n);
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
  // checkpoint image and its verification do not add to the training peak. With CUDA
  // graphs they are kept, with the graphs that point into them, so that the next epoch
  // replays from its first step (the buffers of one batch on top of the save's peak).
  if (!step_graphs_apply()) {
    drop_step_graphs();  // they point into the workspaces
    model_->release_workspaces();
    batch_x_ = batch_labels_ = dlogits_ = sample_correct_ = Tensor();
  }
  save(CheckpointKind::Last);
  if (*improved) save(CheckpointKind::Best);
  if (const int64_t k = cfg_.checkpoint.keep_best; k > 0) {
    const std::vector<int64_t> best = best_epochs(history_, es.monitor, k);
    if (std::count(best.begin(), best.end(), epoch_) > 0) save(CheckpointKind::KeepBest);
  }
  const auto& every = cfg_.checkpoint.every_n_epochs;
  if ((every && epoch_ % *every == 0) ||
      std::count(cfg_.checkpoint.keep_epochs.begin(), cfg_.checkpoint.keep_epochs.end(), epoch_))
    save(CheckpointKind::Milestone);
  hand_step_digests();
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

void Trainer::save(CheckpointKind kind) {
  // Every rank saves at the same point (agreed): the moments are gathered here, and cut
  // again by the next step (saves in a row gather once).
  gather_optimizer_shards();
  hand_step_digests();  // the record of every step a checkpoint holds, before it
  call_sink([&] { sink_->save(*this, kind); });
  last_save_at_ = env_.monotonic_now();
}

void Trainer::hand_step_digests() {
  drain_step_digests();
  if (pending_digests_.empty()) return;
  const std::vector<StepDigest> records = std::move(pending_digests_);
  pending_digests_.clear();
  call_sink([&] { sink_->record_step_digests(*this, records); });
}

bool Trainer::save_by_time_due() {
  const std::optional<double>& every = cfg_.checkpoint.every_seconds;
  return sink_ && every && seconds_since(env_, last_save_at_) >= *every;
}

void Trainer::record_metrics(const std::optional<EvalResult>& test) {
  call_sink([&] { sink_->record_metrics(*this, test); });
}

double Trainer::save_estimate() const { return sink_ ? sink_->save_estimate(*this) : 0.0; }

}  // namespace engine
