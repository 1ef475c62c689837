// The run directory (engine/run/run_directory.h): taking the directory, starting and
// ending its threads, and RunDirectory's own calls: saves, metrics, the save estimate.
// RunDirectory::Impl is in run_directory_impl.h; its writer thread in
// run_directory_writer.cpp, its replicas in run_directory_replicas.cpp, the repairs
// after a survey in run_directory_repair.cpp.
#include "engine/run/run_directory.h"

#include "engine/run/run_files.h"

#include <cerrno>
#include <nlohmann/json.hpp>

#include "engine/run/recovery.h"
#include "io/deferred_remove.h"
#include "run/run_directory_impl.h"

namespace engine {

namespace fs = std::filesystem;
using namespace run_directory_internal;

namespace {

std::string file_for(CheckpointKind kind, int64_t epochs_done) {
  switch (kind) {
    case CheckpointKind::Last:
    case CheckpointKind::MidEpoch: return run_files::kLast;
    case CheckpointKind::Best: return run_files::kBest;
    case CheckpointKind::Milestone: return run_files::milestone(epochs_done);
    case CheckpointKind::KeepBest: return run_files::best_of_epoch(epochs_done);
  }
  return run_files::kLast;
}

}  // namespace

RunDirectory::Impl::Impl(Trainer& t, std::optional<RunDirLock> given, RunDirRole r)
    : trainer(t), env(t.env()), cfg(t.config()), dir(cfg.checkpoint.dir), role(r),
      prototype(t.model().new_instance()) {
  if (env.make_dirs(dir) != 0) throw_filesystem_error("cannot create directories", dir, errno);
  // One writer per run directory, for as long as this lives (run_lock.h).
  if (given && fs::equivalent(given->dir(), dir)) lock.emplace(std::move(*given));
  else lock.emplace(RunDirLock::acquire(dir, &env));
  sweep_dead_writers(env, dir, {std::string(run_files::kTensorBoard) + "/" + run_files::kEventsRewrite});
  if (role == RunDirRole::Owner)
    for (const std::string& r : cfg.checkpoint.replicas) replicas.push_back({r, std::nullopt, {}});
  // A replica that is not usable now is reported, and tried again at every save.
  for (std::size_t i = 0; i < replicas.size(); ++i)
    if (std::optional<ReplicaFailure> f = make_ready(i)) report_replica_failure(*f);
  if (cfg.checkpoint.async && !replicas.empty()) replica_writer = std::thread([this] { replica_loop(); });
  if (cfg.checkpoint.async) writer = std::thread([this] { writer_loop(); });
}

RunDirectory::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> g(mutex);
    quit = true;
  }
  wake.notify_all();
  if (writer.joinable()) writer.join();  // it may still hand copies to the replica thread
  {
    std::lock_guard<std::mutex> g(mutex);
    replica_quit = true;
  }
  replica_wake.notify_all();
  if (replica_writer.joinable()) replica_writer.join();
}

RunDirectory::RunDirectory(Trainer& trainer, std::optional<RunDirLock> lock, RunDirRole role)
    : impl_(std::make_unique<Impl>(trainer, std::move(lock), role)) {}

RunDirectory::~RunDirectory() = default;

FitResult RunDirectory::fit(const StopPlan& stop) {
  FitResult r = impl_->trainer.fit(stop, this);
  // Ended or stopped: the disk holds what a relaunch needs (a throw leaves the slots).
  if (impl_->memory_tier) {
    impl_->memory_tier->remove();
    impl_->memory_tier.reset();
  }
  return r;
}

const std::string& RunDirectory::dir() const { return impl_->dir; }

std::string RunDirectory::path(const std::string& file) const { return (fs::path(impl_->dir) / file).string(); }

std::vector<SaveRecord> RunDirectory::saves() const {
  std::lock_guard<std::mutex> g(impl_->mutex);
  return impl_->records;
}

void RunDirectory::save(Trainer& trainer, CheckpointKind kind) {
  Impl& m = *impl_;
  const auto t0 = m.env.monotonic_now();
  const std::string file = file_for(kind, trainer.epochs_done());
  // Saves in a row with nothing trained between them (last.h5, then best.h5 or a
  // milestone, at an epoch's end) hold the same state: they share one snapshot.
  const std::array<int64_t, 3> taken_at{trainer.global_step(), trainer.epochs_done(), trainer.step_in_epoch()};
  Impl::Snapshot snap;
  {
    std::lock_guard<std::mutex> g(m.mutex);
    if (const Impl::Job* p = m.pending_checkpoint(); p && p->taken_at == taken_at) snap = {p->state, p->copies_done};
  }
  if (!snap.state) {
    // One snapshot buffer: a save still holding it is waited for (that wait is stall).
    m.wait_until([&m] { return m.pending_checkpoint() == nullptr; });
    snap = m.copy_into_buffer(trainer.snapshot());
  }
  m.report_outcomes();  // an earlier save's failure surfaces here at the latest
  SaveRecord record;
  record.file = file;
  // An end-of-epoch save follows the epoch's ++epoch; a mid-epoch one is in the next.
  record.epoch = trainer.epochs_done() + (kind == CheckpointKind::MidEpoch ? 1 : 0);
  record.global_step = trainer.global_step();
  record.stall_seconds = seconds_since(m.env, t0);
  Impl::Job job;
  job.path = path(file);
  job.kind = kind;
  job.state = std::move(snap.state);
  job.copies_done = std::move(snap.copies_done);
  job.requested = t0;
  job.taken_at = taken_at;
  if (kind == CheckpointKind::KeepBest)
    job.keep_best = best_epochs(trainer.history(), trainer.config().train.early_stopping.monitor,
                                trainer.config().checkpoint.keep_best);
  {
    std::lock_guard<std::mutex> g(m.mutex);
    job.record = m.records.size();
    m.records.push_back(record);
  }
  const bool inline_write = !m.writer.joinable();
  m.submit(std::move(job));
  if (inline_write) {
    std::lock_guard<std::mutex> g(m.mutex);
    m.records.back().stall_seconds = seconds_since(m.env, t0);  // checkpoint.async off: all of it
  }
  if (inline_write) m.report_outcomes();
}

void RunDirectory::after_step(Trainer&) { impl_->report_outcomes(); }

void RunDirectory::record_step_digests(Trainer& trainer, const std::vector<StepDigest>& steps) {
  Impl& m = *impl_;
  if (steps.empty() || m.digest_log_failed || m.role != RunDirRole::Owner) return;
  try {
    if (!m.digest_log.is_open()) {
      m.digest_log.open(path(step_digest_log::kFileName), steps.front().global_step - 1, &m.env);
      if (!m.digest_log.cut_reason().empty())
        trainer.observer().on_message("warning: " + path(step_digest_log::kFileName) + ": " +
                                      m.digest_log.cut_reason() + "; the damaged tail was cut");
    }
    m.digest_log.append(steps);
  } catch (const std::exception& e) {
    m.digest_log_failed = true;
    m.digest_log.close();
    trainer.observer().on_message(std::string("warning: step digests are no longer recorded: ") + e.what());
  }
}

std::vector<std::string> RunDirectory::tiers() const {
  std::vector<std::string> out{impl_->dir};
  for (const Impl::Replica& r : impl_->replicas) out.push_back(r.dir);
  return out;
}

void RunDirectory::flush(Trainer&) {
  Impl& m = *impl_;
  // The steps' record as durable as the checkpoints it accompanies.
  if (m.digest_log.is_open() && !m.digest_log_failed) try {
      m.digest_log.sync();
    } catch (const std::exception& e) {
      m.digest_log_failed = true;
      m.digest_log.close();
      m.trainer.observer().on_message(std::string("warning: step digests are no longer recorded: ") + e.what());
    }
  m.wait_until([&m] { return m.all_written(); });
  m.report_outcomes();
}

double RunDirectory::save_estimate(const Trainer& trainer) const {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> g(m.mutex);
    // What is queued is written first: the stop's own save comes after it.
    if (m.slowest_write >= 0) return 1.25 * m.slowest_write * static_cast<double>(1 + m.queue.size());
  }
  // Before the first save, from the state's size: written, fsynced, reloaded through the
  // parser process and compared at 50 MB/s at least, plus a fixed 0.1 s for the parser
  // process and the directory fsync. A 5 MB state: 0.2 s (this once assumed 1 s).
  if (!m.state_bytes) m.state_bytes = static_cast<double>(trainer.state_bytes());
  return 0.1 + *m.state_bytes / 50e6;
}

void RunDirectory::record_metrics(Trainer& trainer, const std::optional<EvalResult>& test) {
  Impl& m = *impl_;
  const std::vector<SaveRecord> saves = this->saves();
  std::string text;
  for (const EpochMetrics& e : trainer.history()) {
    nlohmann::json j = {{"epoch", e.epoch}};
    for (const EpochMetricField& f : epoch_metric_fields()) j[f.name] = e.*f.member;
    // What each save of this epoch made the training thread wait (this process's saves).
    nlohmann::json stalls = nlohmann::json::array();
    for (const SaveRecord& s : saves)
      if (s.epoch == e.epoch)
        stalls.push_back({{"file", s.file}, {"global_step", s.global_step}, {"stall_seconds", s.stall_seconds}});
    if (!stalls.empty()) j["saves"] = stalls;
    text += j.dump() + "\n";
  }
  if (test)
    text += nlohmann::json{{"test_loss", test->loss}, {"test_acc", test->accuracy}, {"test_count", test->count}}.dump() +
            "\n";
  // Written after the checkpoints asked before it, in order, like them off this thread.
  Impl::Job job;
  job.path = path(run_files::kMetrics);
  job.text = std::move(text);
  job.history = trainer.history();
  job.test = test;
  const bool inline_write = !m.writer.joinable();
  m.submit(std::move(job));
  if (inline_write) m.report_outcomes();
}

}  // namespace engine
