#include "engine/run/run_directory.h"

#include "engine/run/run_files.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "engine/run/recovery.h"
#include "train/save_verification.h"
#include "io/checkpoint_copies.h"
#include "io/atomic_file.h"
#include "io/deferred_remove.h"
#include "io/read_file.h"
#include "kernels/cpu/bulk_copy.h"
#include "kernels/cuda_runtime.h"
#include "run/tfevents.h"

namespace engine {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Env& env, Clock::time_point t0) {
  return std::chrono::duration<double>(env.monotonic_now() - t0).count();
}

// What the std::filesystem call this stands for throws, worded as it words it.
[[noreturn]] void throw_filesystem_error(const char* what, const std::string& path, int err) {
  throw fs::filesystem_error(what, fs::path(path), std::error_code(err, std::generic_category()));
}

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

// What kind of failure a replica's error is, so that each kind is reported once: the
// system's reason at the end of the message ("No space left on device"), or "busy".
std::string failure_kind(const std::string& what, bool busy) {
  if (busy) return "busy";
  const std::size_t colon = what.rfind(": ");
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

// The writer thread takes no asynchronous signal: the CLI's handlers run on the training
// thread, and SIGXFSZ stays blocked so that a write past `ulimit -f` fails with EFBIG.
void block_signals_on_this_thread() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGQUIT, SIGXFSZ, SIGPIPE}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// The replica thread is a background tier: it takes the CPU and the disk only when
// training and the run directory's writer leave them (lowest CPU priority; the idle I/O
// class, where the I/O scheduler has one). Linux; a hint elsewhere ignored.
void yield_to_training() {
#if defined(__linux__)
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19);
  constexpr int kWhoProcess = 1, kClassIdle = 3, kClassShift = 13;  // linux/ioprio.h
  (void)::syscall(SYS_ioprio_set, kWhoProcess, tid, kClassIdle << kClassShift);
#endif
}

}  // namespace

struct RunDirectory::Impl {
  // One file to write, in the order asked: a checkpoint (its state as it was when asked,
  // in the snapshot buffer) or a small text file (metrics.jsonl, with the TensorBoard events).
  struct Job {
    std::string path;
    CheckpointKind kind = CheckpointKind::Last;
    std::shared_ptr<const Checkpoint> state;  // null: a metrics job
    // Set when device tensors of `state` are still being copied into the snapshot buffer
    // on the compute stream: the writer waits for it before it reads them.
    kernels::cuda::StreamMark copies_done;
    std::size_t record = 0;
    Clock::time_point requested;
    // metrics job
    std::string text;
    std::vector<EpochMetrics> history;
    std::optional<EvalResult> test;
    // What the state was taken at (see save()): equal keys, equal state.
    std::array<int64_t, 3> taken_at{};
    // A KeepBest save: the epochs whose best_epoch_NNNN.h5 stay (checkpoint.keep_best).
    std::vector<int64_t> keep_best;
  };
  // A second-tier directory (checkpoint.replicas): written on the replica thread, under
  // its own lock, its failures reported once per kind on the training thread.
  struct Replica {
    std::string dir;
    std::optional<RunDirLock> lock;  // taken when the directory first becomes usable
    std::set<std::string> reported;  // training thread: the failure kinds told already
  };
  struct ReplicaFailure {
    std::size_t replica;
    std::string kind, message;
  };
  // A saved file's sealed bytes, for the replicas: the newest version of each file name
  // waits here. The replica thread writes them from this copy of the image, and only while
  // the run directory's writer is idle, so that the snapshot buffer, which the training
  // thread waits for, is free as soon as the run directory's file is written and
  // verified; when saves come faster than that, a file's older version still waiting is
  // replaced by the newer one (each replica always gets each file's newest version).
  struct ReplicaCopy {
    std::string file;
    CheckpointKind kind = CheckpointKind::Last;
    std::vector<int64_t> keep_best;
    std::shared_ptr<const std::string> image;
  };
  // A finished job, reported on the training thread (observer calls, warnings, errors).
  struct Outcome {
    std::string path;
    CheckpointKind kind;
    bool checkpoint;
    std::exception_ptr error;
  };

  Impl(Trainer& t, std::optional<RunDirLock> given, RunDirRole r)
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

  // The replica's directory made and locked (once); nothing, or why it cannot be written.
  std::optional<ReplicaFailure> make_ready(std::size_t i) {
    Replica& r = replicas[i];
    if (r.lock) {
      if (env.make_dirs(r.dir) == 0) return std::nullopt;  // removed meanwhile: made again
      const int err = errno;
      return ReplicaFailure{i, failure_kind(std::strerror(err), false),
                            r.dir + ": cannot create the replica directory: " + std::strerror(err)};
    }
    if (env.make_dirs(r.dir) != 0) {
      const int err = errno;
      return ReplicaFailure{i, failure_kind(std::strerror(err), false),
                            r.dir + ": cannot create the replica directory: " + std::strerror(err)};
    }
    try {
      r.lock.emplace(RunDirLock::acquire(r.dir, &env));
    } catch (const RunDirBusy& e) {
      return ReplicaFailure{i, failure_kind(e.what(), true), e.what()};
    } catch (const std::exception& e) {
      return ReplicaFailure{i, failure_kind(e.what(), false), e.what()};
    }
    sweep_dead_writers(env, r.dir);
    return std::nullopt;
  }

  // On the training thread: once per replica and kind of failure.
  void report_replica_failure(const ReplicaFailure& f) {
    Replica& r = replicas[f.replica];
    if (!r.reported.insert(f.kind).second) return;
    trainer.observer().on_message("warning: replica " + r.dir + " not written: " + f.message +
                                  "; training goes on (reported once per kind of failure)");
  }

  ~Impl() {
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

  void replica_loop() {
    block_signals_on_this_thread();
    yield_to_training();
    std::unique_lock<std::mutex> g(mutex);
    for (;;) {
      // Only while the run directory's writer is idle: a replica never delays the save
      // that the training thread may be waiting for.
      replica_wake.wait(g, [this] { return (!replica_pending.empty() && queue.empty()) || replica_quit; });
      if (replica_pending.empty()) return;
      ReplicaCopy c = std::move(replica_pending.front());
      replica_pending.pop_front();
      replica_busy = true;
      g.unlock();
      write_replicas(c, ReplicaTurn::WhileWriterIdle);
      g.lock();
      replica_busy = false;
      idle.notify_all();
    }
  }

  // Hands a saved file to the replicas: queued for the replica thread (replacing an older
  // version of the same file still waiting), or written now without checkpoint.async.
  void hand_to_replicas(ReplicaCopy c) {
    if (!replica_writer.joinable()) {
      write_replicas(c, ReplicaTurn::Now);
      return;
    }
    {
      std::lock_guard<std::mutex> g(mutex);
      auto same = std::find_if(replica_pending.begin(), replica_pending.end(),
                               [&](const ReplicaCopy& p) { return p.file == c.file; });
      if (same != replica_pending.end()) *same = std::move(c);
      else replica_pending.push_back(std::move(c));
    }
    replica_wake.notify_all();
  }

  // Every usable replica gets the file, atomically; then its milestones are rotated and
  // its best_epoch files pruned like the run directory's.
  enum class ReplicaTurn { Now, WhileWriterIdle };
  void write_replicas(const ReplicaCopy& c, ReplicaTurn when) {
    std::vector<ReplicaFailure> failed;
    std::vector<std::size_t> written;
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      if (std::optional<ReplicaFailure> f = make_ready(i)) {
        failed.push_back(*f);
        continue;
      }
      try {
        // In 1 MiB pieces, each after the run directory's writer is idle again: a save
        // queued meanwhile is never kept waiting behind a whole replica write.
        atomic_write(env, (fs::path(replicas[i].dir) / c.file).string(), [&](int fd) {
          constexpr std::size_t kPiece = std::size_t(1) << 20;
          const auto* bytes = reinterpret_cast<const unsigned char*>(c.image->data());
          for (std::size_t at = 0; at < c.image->size(); at += kPiece) {
            if (when == ReplicaTurn::WhileWriterIdle) {
              std::unique_lock<std::mutex> g(mutex);
              replica_wake.wait(g, [this] { return queue.empty(); });
            }
            if (const int err = write_fully_at(env, fd, bytes + at, std::min(kPiece, c.image->size() - at),
                                               static_cast<off_t>(at)))
              return err;
          }
          return 0;
        });
        tidy(replicas[i].dir, c.kind, c.keep_best);
        written.push_back(i);
      } catch (const std::exception& e) {
        failed.push_back({i, failure_kind(e.what(), false), e.what()});
      }
    }
    std::lock_guard<std::mutex> g(mutex);
    replica_failures.insert(replica_failures.end(), failed.begin(), failed.end());
    replicas_written.insert(replicas_written.end(), written.begin(), written.end());
  }

  void writer_loop() {
    block_signals_on_this_thread();
    std::unique_lock<std::mutex> g(mutex);
    for (;;) {
      wake.wait(g, [this] { return !queue.empty() || quit; });
      if (queue.empty()) return;  // quit, and nothing left to write
      const Job j = queue.front();
      g.unlock();
      run_job(j);
      g.lock();
      queue.pop_front();  // the snapshot buffer is free once no checkpoint job holds it
      idle.notify_all();
      if (queue.empty()) replica_wake.notify_all();
    }
  }

  // A checkpoint: serialise, CRC, write, fsync, rename, fsync the directory
  // (save_checkpoint), verify, rotate milestones. Metrics: metrics.jsonl, TensorBoard.
  // On the writer thread, or on the training thread without checkpoint.async.
  void run_job(const Job& j) {
    const auto t0 = env.monotonic_now();
    std::exception_ptr error;
    try {
      if (j.state) {
        kernels::cuda::wait_for(j.copies_done);
        // One image for every tier: the run directory's file now, the replicas' from the
        // same sealed bytes on the replica thread (whether or not this write succeeded).
        std::shared_ptr<std::string> image = replicas.empty() ? nullptr : std::make_shared<std::string>();
        const std::exception_ptr failed =
            checkpoint_internal::save_checkpoint_copies({j.path}, *j.state, &env, image.get()).front();
        if (image) hand_to_replicas({fs::path(j.path).filename().string(), j.kind, j.keep_best, std::move(image)});
        if (failed) std::rethrow_exception(failed);
        if (cfg.checkpoint.verify) verify_saved_checkpoint(j.path, *j.state, *prototype, env);
        tidy(dir, j.kind, j.keep_best);
      } else {
        // Replaced like a checkpoint: a crash leaves the old or the new file, never a torn one.
        write_file_atomically(env, j.path, j.text);
        if (cfg.logging.tensorboard) tfevents::write_run_events(env, dir, j.history, j.test);
      }
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> g(mutex);
    if (j.state) {
      records[j.record].total_seconds = seconds_since(env, j.requested);
      slowest_write = std::max(slowest_write, seconds_since(env, t0));
    }
    outcomes.push_back({j.path, j.kind, j.state != nullptr, error});
  }

  // After a save into `tier`: the milestones rotated, the best_epoch files pruned.
  void tidy(const std::string& tier, CheckpointKind kind, const std::vector<int64_t>& keep_best) {
    if (kind == CheckpointKind::Milestone) rotate_milestones(tier);
    if (kind == CheckpointKind::KeepBest) prune_best_epochs(tier, keep_best);
  }

  // Keep only the best_epoch_NNNN.h5 of the k best epochs.
  void prune_best_epochs(const std::string& tier, const std::vector<int64_t>& keep) {
    std::vector<std::string> names;
    if (env.list_dir(tier, names) != 0) throw_filesystem_error("directory iterator cannot open directory", tier, errno);
    for (const std::string& f : names) {
      if (f.rfind("best_epoch_", 0) != 0 || !is_run_checkpoint(f)) continue;
      const int64_t e = std::stoll(f.substr(11, 4));
      if (std::count(keep.begin(), keep.end(), e) > 0) continue;
      const std::string p = (fs::path(tier) / f).string();
      if (env.remove(p) != 0 && errno != ENOENT) throw_filesystem_error("cannot remove", p, errno);
    }
  }

  // Keep the newest keep_last milestones, plus those named in keep_epochs.
  void rotate_milestones(const std::string& dir) {
    std::vector<std::string> names;
    if (env.list_dir(dir, names) != 0) throw_filesystem_error("directory iterator cannot open directory", dir, errno);
    std::vector<std::pair<int64_t, fs::path>> milestones;
    for (const std::string& f : names) {
      long long e = 0;
      char tail[8] = {0};
      if (std::sscanf(f.c_str(), "epoch_%lld.%3s", &e, tail) == 2 && std::string(tail) == "h5" && f.size() == 13)
        milestones.emplace_back(e, fs::path(dir) / f);
    }
    std::sort(milestones.rbegin(), milestones.rend());
    int64_t kept = 0;
    for (auto& [e, p] : milestones) {
      const auto& pinned = cfg.checkpoint.keep_epochs;
      if (std::count(pinned.begin(), pinned.end(), e) > 0) continue;
      if (kept++ < cfg.checkpoint.keep_last || env.remove(p.string()) == 0) continue;
      const int err = errno;
      if (err != ENOENT) throw_filesystem_error("cannot remove", p.string(), err);  // gone already: no error
    }
  }

  // Nothing queued or being written, in any tier (mutex held).
  bool all_written() const { return queue.empty() && replica_pending.empty() && !replica_busy; }

  // The queued checkpoint that still holds the snapshot buffer, if any (mutex held).
  const Job* pending_checkpoint() const {
    for (auto it = queue.rbegin(); it != queue.rend(); ++it)
      if (it->state) return &*it;
    return nullptr;
  }

  void wait_until(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> g(mutex);
    idle.wait(g, done);
  }

  // Runs `j` now (no writer thread) or queues it.
  void submit(Job j) {
    {
      std::lock_guard<std::mutex> g(mutex);
      if (writer.joinable()) {
        queue.push_back(std::move(j));
        wake.notify_all();
        return;
      }
    }
    run_job(j);
  }

  // On the training thread: the observer hears of completed saves; a failed one is a
  // warning (checkpoint.on_error = continue) or thrown (stop; and always for a failed
  // verification, which is not the disk's refusal but a wrong file).
  void report_outcomes() {
    std::vector<Outcome> done;
    std::vector<ReplicaFailure> failed;
    std::vector<std::size_t> written;
    {
      std::lock_guard<std::mutex> g(mutex);
      done.swap(outcomes);
      failed.swap(replica_failures);
      written.swap(replicas_written);
    }
    for (const std::size_t i : written) replicas[i].reported.clear();  // a new failure is news again
    for (const ReplicaFailure& f : failed) report_replica_failure(f);
    for (const Outcome& o : done) {
      if (!o.error) {
        if (o.checkpoint) trainer.observer().on_checkpoint(o.path, o.kind);
        if (o.checkpoint) peer_reported.clear();  // a new failure is news again
        continue;
      }
      try {
        std::rethrow_exception(o.error);
      } catch (const CheckpointWriteError& e) {
        if (role == RunDirRole::PeerCopy) {
          // A copy: reported once per kind, training goes on.
          if (peer_reported.insert(failure_kind(e.what(), false)).second)
            trainer.observer().on_message(std::string("warning: peer copy not written: ") + e.what() +
                                          "; training goes on (reported once per kind of failure)");
          continue;
        }
        if (!continue_after_write_failure()) throw;
        warn_write_failure(e);
      }
    }
  }

  // The one reading of checkpoint.on_error.
  bool continue_after_write_failure() const { return cfg.checkpoint.on_error == SaveErrorPolicy::Continue; }
  void warn_write_failure(const CheckpointWriteError& e) {
    trainer.observer().on_message(std::string("warning: ") + e.what() +
                                  "; training goes on (checkpoint.on_error = continue), the next save retries");
  }

  // The state into the snapshot buffer: host tensors kept from save to save (reallocated
  // only when a shape changes). Only called while no queued job holds the buffer. The
  // buffer of a device tensor is pinned host memory: its copies are queued on the
  // compute stream behind the step that produced the state, and `copies_done` marks
  // their end for the writer thread, which waits for it before it reads them. The
  // training thread does not wait: the next step queues behind the copies.
  struct Snapshot {
    std::shared_ptr<const Checkpoint> state;
    kernels::cuda::StreamMark copies_done;  // null when every tensor was on the host
  };
  Snapshot copy_into_buffer(const Checkpoint& live) {
    auto c = std::make_shared<Checkpoint>(live);  // meta, config and scalars by value; tensors below
    bool copies_queued = false;
    for (auto& [group, d] : c->groups) {
      auto& bufs = buffers[group];
      for (auto& [key, t] : d.tensors) {
        Tensor& b = bufs[key];
        if (!b.defined() || b.shape() != t.shape() || b.dtype() != t.dtype()) b = host_buffer_for(t);
        if (t.numel() > 0 && t.device().is_cuda()) {
          kernels::cuda::copy_to_pinned_host_async(b.raw(), t.raw(), t.nbytes());
          copies_queued = true;
        } else if (t.numel() > 0) {
          // Only the writer thread reads the buffer: streaming stores spare the training
          // thread the cache misses of a cold destination (part of the target of <= 1 ms).
          kernels::cpu::copy_bypassing_cache(b.raw(), t.raw(), t.nbytes());
        }
        t = b;
      }
    }
    Snapshot s;
    if (copies_queued) s.copies_done = kernels::cuda::mark_stream();
    s.state = std::move(c);
    return s;
  }
  static Tensor host_buffer_for(const Tensor& t) {
    if (!t.device().is_cuda()) return Tensor::empty(t.shape(), t.dtype());
    void* p = kernels::cuda::alloc_pinned_host(t.nbytes());
    std::shared_ptr<void> owner(p, [](void* q) { kernels::cuda::free_pinned_host(q); });
    return Tensor::wrap_host(std::move(owner), p, t.shape(), t.dtype());
  }

  Trainer& trainer;
  Env& env;  // the trainer's: this directory's files and timings, the writer thread's too
  const Config cfg;
  const std::string dir;
  const RunDirRole role;
  std::set<std::string> peer_reported;  // PeerCopy: the failure kinds told already
  std::optional<RunDirLock> lock;
  std::vector<Replica> replicas;  // their locks: the replica thread's (and before it starts)
  const std::unique_ptr<Model> prototype;  // the writer's: verification builds its instances from it
  std::map<std::string, std::map<std::string, Tensor>> buffers;  // training thread only
  std::optional<double> state_bytes;  // for the first save's estimate

  mutable std::mutex mutex;  // guards what follows
  std::condition_variable wake, idle;
  std::deque<Job> queue;  // front: the job being written
  bool quit = false;
  std::vector<Outcome> outcomes;
  std::condition_variable replica_wake;
  std::deque<ReplicaCopy> replica_pending;
  bool replica_busy = false, replica_quit = false;
  std::vector<ReplicaFailure> replica_failures;  // for the training thread to report
  std::vector<std::size_t> replicas_written;     // replicas written since the last report
  std::vector<SaveRecord> records;
  double slowest_write = -1;  // seconds of the slowest checkpoint write + verification so far

  std::thread replica_writer;  // started before `writer`, which hands it copies
  std::thread writer;          // last: started once everything above exists
};

RunDirectory::RunDirectory(Trainer& trainer, std::optional<RunDirLock> lock, RunDirRole role)
    : impl_(std::make_unique<Impl>(trainer, std::move(lock), role)) {}

RunDirectory::~RunDirectory() = default;

FitResult RunDirectory::fit(const StopPlan& stop) { return impl_->trainer.fit(stop, this); }

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

std::vector<std::string> RunDirectory::tiers() const {
  std::vector<std::string> out{impl_->dir};
  for (const Impl::Replica& r : impl_->replicas) out.push_back(r.dir);
  return out;
}

std::vector<std::string> RunDirectory::repair_from(const std::string& bytes, int64_t global_step,
                                                  const std::string& source, const RunSurvey& survey) {
  Impl& m = *impl_;
  m.wait_until([&m] { return m.all_written(); });
  std::vector<std::string> lines;
  std::vector<std::string> writable{m.dir};
  for (const Impl::Replica& r : m.replicas)
    if (r.lock) writable.push_back(r.dir);
  for (const std::string& tier : writable) {
    const CheckpointCopy* here = nullptr;
    for (const CheckpointCopy& c : survey.copies)
      if (c.dir == tier && c.file == run_files::kLast) here = &c;
    std::string why;
    if (!here) why = "missing";
    else if (here->verdict == CopyVerdict::Damaged) why = "damaged: " + here->reason;
    else if (here->verdict == CopyVerdict::OtherRun) continue;
    else if (here->global_step < global_step)
      why = "stale: global step " + std::to_string(here->global_step) + ", " + source + " has " +
            std::to_string(global_step);
    else continue;
    const std::string target = (fs::path(tier) / run_files::kLast).string();
    try {
      if (m.env.make_dirs(tier) != 0) throw_filesystem_error("cannot create directories", tier, errno);
      write_file_atomically(m.env, target, bytes);
      lines.push_back("repaired " + target + " (" + why + ") from " + source);
    } catch (const std::exception& e) {
      lines.push_back(std::string("warning: cannot repair ") + target + " (" + why + "): " + e.what());
    }
  }
  return lines;
}

std::vector<std::string> RunDirectory::repair(const RunSurvey& survey) {
  Impl& m = *impl_;
  m.wait_until([&m] { return m.all_written(); });  // nothing in flight writes a tier meanwhile
  std::vector<std::string> lines;
  const CheckpointCopy* used = survey.chosen_copy();
  if (!used) return lines;
  // The tiers this process holds the lock of: only those are written.
  std::vector<std::string> writable{m.dir};
  for (const Impl::Replica& r : m.replicas)
    if (r.lock) writable.push_back(r.dir);
  // Each file name's reference: last.h5's is the copy resumed from; another name's, its
  // newest sound copy in any tier.
  std::map<std::string, const CheckpointCopy*> reference;
  reference[run_files::kLast] = used;
  for (const CheckpointCopy& c : survey.copies) {
    if (c.verdict != CopyVerdict::Sound || c.file == run_files::kLast) continue;
    const CheckpointCopy*& r = reference[c.file];
    if (!r || c.global_step > r->global_step) r = &c;
  }
  for (const auto& [file, ref] : reference) {
    for (const std::string& tier : writable) {
      const CheckpointCopy* here = nullptr;
      for (const CheckpointCopy& c : survey.copies)
        if (c.dir == tier && c.file == file) here = &c;
      std::string why;
      if (!here) why = "missing";
      else if (here->verdict == CopyVerdict::Damaged) why = "damaged: " + here->reason;
      else if (here->verdict == CopyVerdict::OtherRun) continue;  // another run's: this run's next save replaces it
      else if (here->global_step < ref->global_step)
        why = "stale: global step " + std::to_string(here->global_step) + ", " + ref->path + " has " +
              std::to_string(ref->global_step);
      else continue;
      if (here == ref) continue;
      const std::string target = (fs::path(tier) / file).string();
      std::string bytes;
      if (read_whole_file(m.env, ref->path, bytes) != 0) {
        const int err = errno;
        lines.push_back("warning: cannot repair " + target + " (" + why + "): cannot read " + ref->path + ": " +
                        std::strerror(err));
        continue;
      }
      try {
        if (m.env.make_dirs(tier) != 0) throw_filesystem_error("cannot create directories", tier, errno);
        write_file_atomically(m.env, target, bytes);
        lines.push_back("repaired " + target + " (" + why + ") from " + ref->path);
      } catch (const std::exception& e) {
        lines.push_back(std::string("warning: cannot repair ") + target + " (" + why + "): " + e.what());
      }
    }
  }
  return lines;
}

void RunDirectory::flush(Trainer&) {
  Impl& m = *impl_;
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
